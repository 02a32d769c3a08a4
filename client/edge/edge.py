"""`fedveil client`: one device of a federation — a Flower SuperNode plus fedveil's worker.

Two processes. `flower-supernode` (a child that dies with this one; Flower's,
with the reply step of its loop fixed in supernode.py) talks to
the coordinator's Fleet API over TLS, authenticated with the device's key,
and queues each request as a task on its loopback Runtime API (process
isolation). This process is the worker: it claims those tasks (HMAC-signed
with a secret made at each start, so no other local process can), answers
each with EdgeClient and pushes the reply. Data and model stay loaded between
rounds, and the code that runs is the fedveil installed here — never code
from the server (a run of another Flower app is refused unless the device's
policy allows it, --allow-app; even then the device answers with its own code).

Reconnection: the SuperNode retries an unreachable or restarting coordinator
with exponential backoff (Flower's, up to 20 s between tries). If the
SuperNode exits — the key was revoked, TLS failed, it crashed — this process
restarts it with its own backoff (1 s doubling to max_backoff_s). A request
it cannot use is answered with an error and logged; the worker goes on.

The Runtime API's port: the SuperNode reports the port it listens on, and the
worker talks to that port only; a port taken between its pick and the
SuperNode's bind costs a restart on a fresh port, not the device (runtime_port.py).
"""

from __future__ import annotations

import faulthandler
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fedveil.client.dpsgd_budget import DpSgdLedger
from fedveil.client.edge.device_app import (
    DP_SGD_DIR,
    MASKED_INPUTS_DIR,
    PARTICIPATION_DIR,
    EdgeClient,
    answer,
)
from fedveil.client.edge.ledger_guard import LedgerGuard
from fedveil.client.edge.runtime_port import (
    EXIT_RUNTIME_UNBOUND,
    FLAG,
    PORT_TRIES,
    RuntimePortUnavailable,
)
from fedveil.client.edge.tls_probe import insecure_against_tls_error, server_speaks_tls
from fedveil.client.edge.witness import WitnessStore
from fedveil.client.ftrl_participation import ParticipationGuard
from fedveil.client.masked_input_counts import MaskedInputCounts
from fedveil.ops.private_file import write_private_file
from fedveil.ops.procs import (
    await_reported_port,
    child_env,
    flwr_command,
    free_port,
    spawn,
    stop_group,
)

log = logging.getLogger("fedveil.edge")

ACQUIRE = "/flwr.proto.Runtime/AcquireTask"
HEARTBEAT_S = 10.0  # a claimed task's heartbeat (Flower expires tasks silent for much longer)
# The SuperNode offers a task while it is still downloading the message's objects. Flower's
# own pull waits up to two hours for them, during which the device serves nobody and cannot
# stop. Ours gives up as soon as the SuperNode drops the message (its download failed, or
# the coordinator said the run stopped: supernode.forget_given_up), on a stop request, or,
# the fallback for a link that went silent, when no object has arrived for
# EdgeOptions.task_pull_stall_s (`--download-stall-seconds`; a slow link still makes
# progress), at most Flower's own two hours.
TASK_PULL_STALL_S = 60.0
MAX_TASK_PULL_STALL_S = 7200.0
APP_REFUSED = 4003  # a run of an app this device's policy does not allow (--allow-app)


class TaskPullAbandoned(RuntimeError):
    """The message of a claimed task cannot be pulled (stalled, or the device is stopping)."""


def write_runtime_secret(path: Path) -> bytes:
    """A fresh SuperExec auth secret (OS CSPRNG) at `path`, readable by this user only.

    Whoever reads it can claim the device's tasks from its SuperNode on loopback (the
    global model, the run config) and answer as the device, so the file is always a new
    one of mode 0600 (fedveil/ops/private_file.py): an old file of another mode (a state
    directory restored or copied), or a link another user planted in a shared state
    directory, is replaced, never written through. A path that cannot be replaced fails
    the start, naming it."""
    secret = secrets.token_bytes(32)
    write_private_file(path, secret)
    return secret


@dataclass
class EdgeOptions:
    server: str  # the coordinator's Fleet API, host:port
    client_id: int
    state_dir: Path
    ca: Path | None = None
    key: Path | None = None
    insecure: bool = False
    runtime_port: int = 0  # 0: any free loopback port (a fresh one if it is taken)
    max_backoff_s: float = 60.0
    poll_s: float = 0.25
    # A message download with nothing arriving for this long is given up (see above).
    task_pull_stall_s: float = TASK_PULL_STALL_S

    def check(self) -> None:
        stall = self.task_pull_stall_s
        # Written so that NaN fails it (a NaN limit would never end a stalled download).
        if isinstance(stall, bool) or not (
            isinstance(stall, (int, float)) and 0 < stall <= MAX_TASK_PULL_STALL_S
        ):
            raise ValueError(
                f"--download-stall-seconds {stall!r}: must be a number in "
                f"(0, {MAX_TASK_PULL_STALL_S:g}]"
            )
        host, sep, port = self.server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--server {self.server!r}: expected HOST:PORT")
        if self.insecure and self.key is not None:
            raise ValueError(
                "--key needs TLS: SuperNode authentication is not possible with --insecure"
            )
        for name in ("ca", "key"):
            p = getattr(self, name)
            if p is not None and not Path(p).is_file():
                raise ValueError(f"--{name} {p}: no such file")


def warm_up() -> None:
    """Run torch's training path once while the SuperNode connects.

    The first optimizer step loads much of torch lazily; on a small device that is
    seconds, which would otherwise land in the first round this device is sampled for.
    """
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.zeros(2, 4)).sum().backward()
    opt.step()


class EdgeNode:
    def __init__(
        self, opts: EdgeOptions, edge: EdgeClient, pick_port: Callable[[], int] = free_port
    ) -> None:
        """`pick_port`: where a port to try comes from when opts.runtime_port is 0."""
        opts.check()
        self.opts, self.edge = opts, edge
        if edge.ledger_guard.store is None:
            # Verify and keep every privacy-ledger head the coordinator shows this device
            # (pins survive a restart): the auditor checks them with `fedveil privacy
            # verify --witness`.
            edge.ledger_guard = LedgerGuard(WitnessStore(opts.state_dir / "witness"))
        if edge.participation.directory is None:
            # DP-FTRL: the participations this device counted survive a restart.
            edge.participation = ParticipationGuard(opts.state_dir / PARTICIPATION_DIR)
        if edge.masked_inputs.directory is None:
            # Distributed DP: the masked inputs sent per run survive a restart, so the
            # run's participation limit does too (client/masked_input_counts.py).
            edge.masked_inputs = MaskedInputCounts(opts.state_dir / MASKED_INPUTS_DIR)
        if edge.dp_sgd_ledger is None:
            # Every DP-SGD round this device trains is accounted on disk, across runs and
            # restarts, and checked against --max-dp-epsilon (client/dpsgd_budget.py).
            policy = edge.policy
            edge.dp_sgd_ledger = DpSgdLedger(
                opts.state_dir / DP_SGD_DIR, policy.max_dp_epsilon, policy.dp_delta
            )
        # Set by the signal handler. A plain attribute on purpose: a handler that takes a
        # lock (threading.Event.set) can deadlock against the main thread holding it.
        self.stopping = False
        self.proc: Any = None
        self.port = 0  # the Runtime API's port, as the running SuperNode reported it
        self.pick_port = pick_port
        self._secret = b""
        self._log_file: Any = None
        self.tasks_done = 0

    # -- the SuperNode -------------------------------------------------------
    def _supernode_argv(self, secret_file: Path, port: int) -> list[str]:
        o = self.opts
        args = [
            "--superlink",
            o.server,
            "--isolation",
            "process",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            FLAG,
            str(self._port_file),
            "--node-config",
            f"client-id={o.client_id}",
            "--superexec-auth-secret-file",
            str(secret_file),
        ]
        if o.insecure:
            args.append("--insecure")
        elif o.ca is not None:
            args += ["--root-certificates", str(o.ca)]
        if o.key is not None:
            args += ["--auth-supernode-private-key", str(o.key)]
        return flwr_command("flower-supernode", args)

    @property
    def _port_file(self) -> Path:
        return self.opts.state_dir / "runtime.port"

    def start_runtime(self, meanwhile: Callable[[], None] = lambda: None) -> None:
        """Start the SuperNode and learn its Runtime API's port from it (runtime_port.py):
        on a port taken meanwhile, again on a fresh one, up to PORT_TRIES times. A
        SuperNode that exits for another reason is left to the restart loop. `meanwhile`
        runs once while the first SuperNode starts."""
        tried: list[int] = []
        for _ in range(1 if self.opts.runtime_port else PORT_TRIES):
            port = self.opts.runtime_port or self.pick_port()
            tried.append(port)
            self._start_supernode(port)
            meanwhile()
            meanwhile = lambda: None  # noqa: E731
            reported = await_reported_port(self._port_file, self.proc, 120.0, lambda: self.stopping)
            if reported is not None:
                self.port = reported
                return
            if self.proc.poll() != EXIT_RUNTIME_UNBOUND:
                if self.proc.poll() is None and not self.stopping:
                    log.warning("SuperNode did not open its Runtime API in 120 s; restarting")
                    stop_group(self.proc, timeout=2)
                return
            log.warning("the Runtime API could not listen on port %d; trying another", port)
        raise RuntimePortUnavailable(tried, self.opts.state_dir / "supernode.log")

    def _start_supernode(self, port: int) -> None:
        o = self.opts
        host, _, fleet_port = o.server.rpartition(":")
        if o.insecure and server_speaks_tls(host, int(fleet_port)):
            # Flower's plaintext channel would only retry "Connection attempt failed" forever.
            raise ValueError(insecure_against_tls_error(o.server))
        o.state_dir.mkdir(parents=True, exist_ok=True)
        secret_file = o.state_dir / "runtime.secret"
        self._secret = write_runtime_secret(secret_file)
        if self._log_file is None:
            self._log_file = (o.state_dir / "supernode.log").open("ab")
        env = child_env({"FLWR_HOME": str(o.state_dir / "flwr")})
        self._port_file.unlink(missing_ok=True)  # a previous SuperNode's report
        self.proc = spawn(self._supernode_argv(secret_file, port), env=env, log=self._log_file)
        log.info(
            "client %d: SuperNode started (pid %d) for %s%s",
            o.client_id,
            self.proc.pid,
            o.server,
            "" if o.insecure else " over TLS",
        )

    def _supernode_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- the worker ----------------------------------------------------------
    def _runtime_client(self, token: str | None) -> Any:
        from flwr.supercore.interceptors import (
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
        )
        from flwr.supercore.runtime import RuntimeHttpClient

        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="fedveil-client")]
        if token is None:
            interceptors.append(
                SuperExecAuthHttpInterceptor(
                    master_secret=self._secret, protected_methods={ACQUIRE}
                )
            )
        else:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        # Plain HTTP on loopback only: claims are HMAC-signed, tasks token-bound. A short
        # timeout keeps a stop request from waiting on a SuperNode that is going away.
        return RuntimeHttpClient(
            f"http://127.0.0.1:{self.port}", interceptors=interceptors, verify=False, timeout=10.0
        )

    def _acquire(self, client: Any) -> tuple[str, Any] | None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if res.HasField("task") and res.token:
            return res.token, res.task
        return None

    def _run_task(self, token: str) -> None:
        from flwr.app import Error, Message
        from flwr.common.config import get_fab_config
        from flwr.common.constant import SubStatus
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        client = self._runtime_client(token)

        # The task stays claimed while its heartbeat runs. Our own daemon thread rather
        # than Flower's sender: that one joins on stop and signals SIGINT on failure.
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(HEARTBEAT_S):
                try:
                    client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
                except httpx.HTTPError as exc:
                    log.debug("task heartbeat failed: %s", exc)

        threading.Thread(target=heartbeat, name="task-heartbeat", daemon=True).start()
        context = None
        try:
            context, run, fab = pull_task_input(client)
            try:
                components = get_fab_config(fab.content)["tool"]["flwr"]["app"]["components"]
                clientapp = components.get("clientapp")
            except Exception:
                clientapp = None
            # Which apps' runs this device takes part in is its own policy (--allow-app).
            refusal = self.edge.policy.app_refusal(run.fab_id, clientapp)
            # The SuperNode hands a task the oldest unanswered message of its run, not the
            # one the task was made for; a task that expired unclaimed (the device was busy
            # elsewhere) would leave the device one message behind for the rest of the run.
            # So a task answers every message of its run that is waiting.
            answered = 0
            while not self.stopping:
                message = pull_message(
                    client, context, self.opts.task_pull_stall_s, lambda: self.stopping
                )
                if message is None:
                    break
                if refusal is None:
                    reply = answer(self.edge, message, context.run_id, context.run_config)
                else:
                    log.warning("run %d refused: %s", context.run_id, refusal)
                    reply = Message(Error(APP_REFUSED, refusal), reply_to=message)
                push_message(client, reply, context)
                answered += 1
            if answered > 1:
                log.info("run %d: answered %d waiting messages", context.run_id, answered)
            push_task_output(client, context, SubStatus.COMPLETED, "")
            self.tasks_done += 1
        except Exception as exc:  # the device keeps serving; the server sees no reply
            log.warning("task abandoned: %s: %s", type(exc).__name__, exc)
            push_task_output(client, context, SubStatus.FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            done.set()
            client.close()

    # -- the loop ------------------------------------------------------------
    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _sleep(self, seconds: float) -> bool:
        """Sleep in short steps; True as soon as a stop was requested."""
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))
        return self.stopping

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request_stop)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where is it?
        backoff, started = 1.0, 0.0
        acquire_client = None
        try:
            while not self.stopping:
                if not self._supernode_alive():
                    if self.proc is not None:
                        code = self.proc.poll()
                        up = time.monotonic() - started
                        backoff = 1.0 if up > 60 else min(backoff * 2, self.opts.max_backoff_s)
                        log.warning(
                            "SuperNode exited (code %s) after %.0f s; restarting in %.0f s "
                            "(a revoked or unknown key, a TLS error or a crash: see %s)",
                            code,
                            up,
                            backoff,
                            self.opts.state_dir / "supernode.log",
                        )
                        stop_group(self.proc, timeout=2)
                        if self._sleep(backoff):
                            break
                    self.start_runtime(warm_up if self.tasks_done == 0 else lambda: None)
                    started = time.monotonic()
                    if acquire_client is not None:
                        acquire_client.close()
                    acquire_client = self._runtime_client(None)  # on the reported port
                    continue
                try:
                    got = self._acquire(acquire_client)
                except httpx.HTTPError as exc:
                    log.debug("runtime API not ready: %s", exc)
                    self._sleep(1.0)
                    continue
                if got is None:
                    self._sleep(self.opts.poll_s)
                    continue
                self._run_task(got[0])
        finally:
            if acquire_client is not None:
                acquire_client.close()
            if self.proc is not None:
                stop_group(self.proc, timeout=5)
            if self._log_file is not None:
                self._log_file.close()
            log.info("client %d stopped after %d tasks", self.opts.client_id, self.tasks_done)
        return 0


def pull_task_input(client: Any) -> tuple[Any, Any, Any]:
    """The task's (context, run, FAB), as Flower's `pull_task_input` has them."""
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.runtime_pb2 import PullTaskInputRequest
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    return context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)


def pull_message(
    client: Any, context: Any, stall_s: float, stopping: Callable[[], bool]
) -> Any | None:
    """The run's oldest waiting message (None: none waits), giving up when its pull stalls
    for `stall_s` or on a stop (Flower's own pull retries for up to two hours)."""
    from flwr.app import Message
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        pull_and_inflate_object_from_tree,
    )

    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        return None
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    pull_object = make_pull_object_fn_protobuf(client.PullObject, node, context.run_id)
    last_arrival = [time.monotonic()]

    def pull_or_give_up(object_id: str) -> bytes:
        # Any exception but "not available yet" ends Flower's retries of every object.
        if stopping():
            raise TaskPullAbandoned("the device is stopping")
        if time.monotonic() - last_arrival[0] > stall_s:
            raise TaskPullAbandoned(f"no part of the message arrived for {stall_s:g} s")
        try:
            content = pull_object(object_id)
        except ObjectPullError as exc:
            # The SuperNode dropped the message: its own pull failed, or the coordinator
            # said the run is no longer running (supernode.forget_given_up).
            raise TaskPullAbandoned(
                f"the SuperNode gave the message up ({exc}); its run stopped or its "
                "download from the coordinator failed"
            ) from exc
        last_arrival[0] = time.monotonic()
        return content

    message = pull_and_inflate_object_from_tree(
        tree,
        pull_or_give_up,
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        backoff_cap=2.0,  # retry often enough to notice a stall or a stop within 2 s
    )
    # A deflated message does not carry its own id (its object id).
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message
