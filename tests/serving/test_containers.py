"""The coordinator, device and serving images (docker/): their install steps are those of
docs/how-to/containers.md (the same torch pin as `make setup`, torch before the package, the
extra that page names for each image), they run as a non-root user, and a healthcheck where
they serve HTTP. Where a container engine is reachable the three images are built and started
once."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import docs_pages
import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
DOCKER = ROOT / "docker"
IMAGES = {
    "Dockerfile.coordinator": True,  # serves HTTP: needs a healthcheck
    "Dockerfile.device": False,
    "Dockerfile.serve": True,
}
# Flags that change how pip works, not what it installs.
PIP_NOISE = {"-q", "--quiet", "--no-cache-dir", "--upgrade-strategy=only-if-needed"}


def pip_step(command: str) -> tuple[str, ...]:
    """A `pip install ...` command as the tokens that decide what is installed."""
    tokens = shlex.split(command)
    if tokens[:3] == ["python", "-m", "pip"]:
        tokens = ["pip", *tokens[3:]]
    return tuple(t for t in tokens if t not in PIP_NOISE)


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_pip_steps(path: Path) -> list[tuple[str, ...]]:
    steps = []
    for word, rest in dockerfile_instructions(path.read_text()):
        if word == "RUN":
            steps += [pip_step(c) for c in rest.split("&&") if re.search(r"\bpip install\b", c)]
    return steps


def readme_section() -> str:
    """docs/how-to/containers.md's Containers section."""
    return docs_pages.section("how-to/containers.md", "Containers")


def readme_steps() -> dict[str, list[tuple[str, ...]]]:
    """Each Dockerfile's install steps as docs/how-to/containers.md gives them: the torch
    line of the section's sh block, then the package install its table row names."""
    section = readme_section()
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    torch_lines = [ln.split("#", 1)[0] for ln in block.splitlines() if "torch==" in ln]
    assert len(torch_lines) == 1, f"one torch install line expected, got {torch_lines}"
    torch = pip_step(torch_lines[0])
    steps = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = next((n for n in IMAGES if f"docker/{n}`" in row), None)
        if name is not None:
            install = next(c.strip("`") for c in cells if c.startswith("`pip install"))
            steps[name] = [torch, pip_step(install)]
    assert set(steps) == set(IMAGES), f"docs table rows: {sorted(steps)}"
    return steps


def test_readme_torch_pin_is_make_setups() -> None:
    make_pin = re.search(r"^TORCH \?= (torch==\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert make_pin, "Makefile lost its TORCH pin"
    two_commands = README.read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert f"`{make_pin.group(1)}`" in two_commands
    for name, steps in readme_steps().items():
        assert make_pin.group(1) in steps[0], (name, steps[0])


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_dockerfile_installs_as_the_readme_says(name: str) -> None:
    expected = readme_steps()[name]
    got = dockerfile_pip_steps(DOCKER / name)
    assert got == expected, f"{name}: pip steps {got}, the docs say {expected}"
    # The package is installed from the checkout, never from an index under its name.
    assert expected[1][2].startswith(".["), expected[1]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_dockerfile_runs_unprivileged_with_a_healthcheck_where_it_serves(name: str) -> None:
    instructions = dockerfile_instructions((DOCKER / name).read_text())
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in {"root", "0"}, f"{name}: last USER is {users}"
    checks = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    if IMAGES[name]:
        assert checks and checks[-1] != "NONE", f"{name} serves HTTP and has no healthcheck"
    else:
        assert checks == ["NONE"], f"{name}: {checks}"
    # Every COPY source exists, so a build cannot fail on a renamed folder.
    for word, rest in instructions:
        if word == "COPY" and not rest.startswith("--from"):
            for src in shlex.split(rest)[:-1]:
                assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path"


def run_example(name: str) -> str:
    """The `docker run` example in the Dockerfile's header, continuation lines joined."""
    header = [ln[1:].strip() for ln in (DOCKER / name).read_text().splitlines() if ln[:1] == "#"]
    text = re.sub(r"\\\s+", " ", "\n".join(header))
    runs = [ln for ln in text.splitlines() if ln.startswith("docker run")]
    assert len(runs) == 1, f"{name}: one docker run example expected, got {runs}"
    return runs[0]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_container_mounts_only_the_certificates_it_needs(name: str) -> None:
    """The examples mounted the whole certs/ (ca.key, every device's key) into every
    container; each now mounts single files, and never a private key it does not use."""
    mounts = re.findall(r"-v (\S+?):(\S+?)(?::ro)?(?:\s|$)", run_example(name))
    sources = [src for src, _ in mounts]
    assert sources, name
    assert not [src for src in sources if src.rstrip("/").endswith("certs")], sources
    assert not [src for src in sources if src.endswith("ca.key")], sources
    keys = [src for src in sources if src.endswith(".key")]
    expected_keys = {
        "Dockerfile.coordinator": ["$PWD/certs/server.key"],
        "Dockerfile.serve": ["$PWD/certs/server.key"],
        "Dockerfile.device": ["$PWD/certs/clients/client-0.key"],
    }
    assert keys == expected_keys[name], (name, keys)


def test_coordinator_state_is_in_its_volume(tmp_path: Path) -> None:
    """server.toml's state_dir = "state" resolved next to the config (/etc/fedveil/state,
    not the volume, unwritable by uid 10001); the image passes --state-dir, its volume,
    which the image creates for that user."""
    text = (DOCKER / "Dockerfile.coordinator").read_text()
    instructions = dockerfile_instructions(text)
    cmd = [rest for word, rest in instructions if word == "CMD"][-1]
    assert '"--state-dir", "/var/lib/fedveil"' in cmd, cmd
    assert "fedveil-state:/var/lib/fedveil" in run_example("Dockerfile.coordinator")
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "--uid 10001" in runs and "-o fedveil -g fedveil -m 700 /var/lib/fedveil" in runs
    # The flag as the image uses it: the state goes where it says, not beside the config.
    from fedveil.server.coordinator.settings import load_settings

    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "server.toml").write_text('state_dir = "state"\n[tls]\ninsecure = true\n')
    assert load_settings(etc / "server.toml").state_dir == etc / "state"
    volume = tmp_path / "volume"
    assert load_settings(etc / "server.toml", state_dir=volume).state_dir == volume


def test_serve_healthcheck_asks_readyz() -> None:
    """/healthz says only that the process answers; /readyz that every model's worker runs."""
    text = (DOCKER / "Dockerfile.serve").read_text()
    assert "FEDVEIL_HEALTH_URL=https://127.0.0.1:8480/readyz" in text
    assert "/healthz FEDVEIL_CA" not in text


def _container_engine() -> str:
    for engine in ("docker", "podman"):
        exe = shutil.which(engine)
        if exe is None:
            continue
        probe = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return exe
        reason = (probe.stderr or probe.stdout).strip().splitlines()[-1:]
        pytest.skip(f"{engine} is on PATH but its engine is not usable: {reason}")
    pytest.skip("no container engine: neither docker nor podman is on PATH")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_builds_and_runs_as_non_root(name: str) -> None:
    engine = _container_engine()
    tag = f"fedveil-test-{name.split('.')[-1]}"
    build = subprocess.run(
        [engine, "build", "-f", str(DOCKER / name), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    uid = subprocess.run(
        [engine, "run", "--rm", "--entrypoint", "id", tag, "-u"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert uid.stdout.strip() not in {"", "0"}, uid.stdout + uid.stderr
    version = subprocess.run(
        [engine, "run", "--rm", "--entrypoint", "fedveil", tag, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.returncode == 0 and "fedveil" in version.stdout, version.stderr
