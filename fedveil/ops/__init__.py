"""Operations helpers shared by the CLI, the coordinator and devices: certificates,
child processes, the HTTP API client."""
