"""`flower-superexec` as the SuperLink starts it, but handing each ServerApp its token in a file.

Flower's SubprocessExecutor (flwr 1.41/1.42) starts `flwr-serverapp --token <token>`,
which puts the live Runtime API token on a command line any local user can read
with `ps`. `flwr-serverapp` also accepts `--token-file` (it has no environment
variable or stdin option), so this shim replaces the executor's `launch` with one
that writes the token to a 0600 file in the 0700 state dir, passes its path, and
deletes the file when the ServerApp exits. The SuperLink finds this shim first on
its PATH (superlink.py); everything else is Flower's own `flower-superexec`.

It also does what the SuperLink's socket needs (link_socket.py): Flower's clients
in this process, and in each ServerApp it starts, talk to the SuperLink over its
Unix socket. And it makes the tree die at once with the SuperLink: Flower starts
the SuperExec in a session of its own and only polls for its parent, and the
ServerApps poll for theirs, so a `kill -9` of the coordinator left them running
for seconds. Here the SuperExec asks for SIGKILL when the SuperLink dies, and
each ServerApp for SIGKILL when the SuperExec dies (procs.die_with_parent; both
are started from their parent's main thread, which lives as long as it does).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

from fedveil.ops.procs import die_with_parent
from fedveil.server.coordinator.link_socket import SOCKET_ENV, route_flower_clients

TOKEN_DIR_ENV = "FEDVEIL_TOKEN_DIR"


def write_token_file(token_dir: Path, token: str) -> Path:
    """A fresh 0600 file holding `token` (O_EXCL: never reuses or follows a planted name)."""
    token_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = token_dir / f"serverapp-{secrets.token_hex(8)}.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token)
    return path


def _unlink_when_done(proc: subprocess.Popen[bytes], path: Path) -> None:
    proc.wait()
    path.unlink(missing_ok=True)


def serverapp_argv() -> list[str]:
    """`flwr-serverapp` in this interpreter, over the SuperLink's socket (link_socket.py)."""
    code = (
        "import sys; sys.argv[0] = 'flwr-serverapp'; "
        "from fedveil.server.coordinator.link_socket import serverapp_main; serverapp_main()"
    )
    return [sys.executable, "-c", code]


def _patch_executor(token_dir: Path) -> None:
    from flwr.supercore.constant import (
        TASK_TYPE_TO_APPIO_API_ADDRESS_ARG,
        TASK_TYPE_TO_COMMAND,
        TaskType,
    )
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

    def launch(self: SubprocessExecutor, spec: ExecutionSpec) -> LaunchResult:
        # Same arguments as Flower's launch, with --token-file in place of --token.
        token_file = write_token_file(token_dir, spec.token)
        command = (
            serverapp_argv()
            if spec.task_type == TaskType.SERVER_APP
            else [TASK_TYPE_TO_COMMAND[spec.task_type]]
        )
        args = [
            *command,
            TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
            spec.runtime_api_address,
            "--token-file",
            str(token_file),
        ]
        if spec.insecure:
            args.append("--insecure")
        elif spec.root_certificates_path is not None:
            args.extend(["--root-certificates", spec.root_certificates_path])
        if spec.parent_pid is not None:
            args.extend(["--parent-pid", str(spec.parent_pid)])
        if spec.runtime_dependency_install:
            args.append("--allow-runtime-dependency-installation")
        out = subprocess.DEVNULL if spec.suppress_output else None
        try:
            proc = subprocess.Popen(
                args, stdout=out, stderr=out, preexec_fn=partial(die_with_parent, os.getpid())
            )
        except BaseException:
            token_file.unlink(missing_ok=True)
            raise
        threading.Thread(
            target=_unlink_when_done, args=(proc, token_file), name="token-file", daemon=True
        ).start()
        return LaunchResult.accepted()

    SubprocessExecutor.launch = launch  # type: ignore[method-assign]


def _parent_pid(argv: list[str]) -> int:
    """The SuperLink's pid, as Flower passes it (`--parent-pid N`), else our parent now."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--parent-pid":
            return int(argv[i + 1])
    return os.getppid()


def main() -> None:
    die_with_parent(_parent_pid(sys.argv))
    route_flower_clients(os.environ[SOCKET_ENV])
    from flwr.supercore.cli import flower_superexec

    _patch_executor(Path(os.environ[TOKEN_DIR_ENV]))
    sys.argv[0] = "flower-superexec"
    sys.exit(flower_superexec())


if __name__ == "__main__":
    main()
