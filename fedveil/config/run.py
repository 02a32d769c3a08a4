"""Run configuration: TOML file plus command-line overrides, validated up front.

Every field carries its own limits, so a bad value fails before any data is
loaded or any model trained, with a message naming the field, the value and
the allowed range.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.config.async_mode import check_async_fields
from fedveil.config.fields import ConfigError, build, help_of, spec
from fedveil.config.poisoning import PoisoningConfig, check_poisoning
from fedveil.config.ray_address import check_ray_address
from fedveil.config.robust_bounds import AGGREGATORS, check_robust_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class DataConfig:
    dataset: str = spec(
        "fashion-mnist",
        choices=("fashion-mnist", "digits", "synthetic"),
        help="built-in dataset (ignored when a custom task brings its own data)",
    )
    data_dir: str | None = spec(None, optional=True, help="where the dataset files are")
    num_clients: int = spec(100, lo=1, hi=1_000_000, help="population size")
    partition: str = spec(
        "dirichlet",
        choices=("iid", "dirichlet", "shards", "lognormal", "writer"),
        help="how the training set is split between clients",
    )
    alpha: float = spec(0.5, lo=0.0, lo_open=True, hi=1e6, help="Dirichlet concentration")
    shards_per_client: int = spec(2, lo=1, hi=100, help="label shards per client")
    sigma: float = spec(1.0, lo=0.0, hi=10.0, help="log-normal quantity-skew sigma")
    min_size: int = spec(10, lo=1, hi=100_000, help="smallest client dataset (dirichlet)")
    synthetic_alpha: float = spec(1.0, lo=0.0, hi=100.0, help="Synthetic(alpha, beta): alpha")
    synthetic_beta: float = spec(1.0, lo=0.0, hi=100.0, help="Synthetic(alpha, beta): beta")


@dataclass
class ModelConfig:
    name: str = spec("cnn", help="built-in model (logreg, mlp, cnn)")
    task: str | None = spec(
        None, optional=True, help="custom task as 'module:function' returning a fedveil Task"
    )


@dataclass
class ClientConfig:
    local_epochs: int = spec(1, lo=0, hi=1000, help="local epochs (0 when local_steps is set)")
    local_steps: int = spec(0, lo=0, hi=1_000_000, help="local SGD steps; 0 means use epochs")
    batch_size: int = spec(32, lo=1, hi=65_536, help="local batch size")
    lr: float = spec(0.05, lo=0.0, lo_open=True, hi=100.0, help="local learning rate")
    momentum: float = spec(0.5, lo=0.0, hi=0.999, help="local SGD momentum")
    weight_decay: float = spec(0.0, lo=0.0, hi=1.0, help="local L2 weight decay")
    prox_mu: float = spec(0.0, lo=0.0, hi=100.0, help="FedProx proximal term mu")
    dp_sgd_noise: float = spec(
        0.0, lo=0.0, hi=100.0, help="sample-level DP-SGD (Opacus) noise multiplier; 0: off"
    )
    dp_sgd_clip: float = spec(
        1.0, lo=0.0, lo_open=True, hi=1e4, help="DP-SGD per-example gradient clip norm"
    )


@dataclass
class ServerConfig:
    rounds: int = spec(60, lo=1, hi=1_000_000, help="number of rounds")
    sampling: str = spec(
        "fixed",
        choices=("fixed", "poisson"),
        help="fixed-size cohorts without replacement, or Poisson sampling with rate q",
    )
    per_round: int = spec(20, lo=1, hi=1_000_000, help="cohort size (fixed sampling)")
    sample_rate: float = spec(
        0.0, lo=0.0, hi=1.0, help="Poisson rate q; 0 means per_round / num_clients"
    )
    min_clients: int = spec(1, lo=1, hi=1_000_000, help="fewest replies that make a round")
    optimizer: str = spec(
        "fedavg", choices=("fedavg", "fedavgm", "fedadam", "fedyogi"), help="server optimizer"
    )
    server_lr: float = spec(1.0, lo=0.0, lo_open=True, hi=100.0, help="server learning rate")
    server_momentum: float = spec(0.9, lo=0.0, hi=0.999, help="FedAvgM momentum")
    beta1: float = spec(0.9, lo=0.0, hi=0.999, help="FedAdam/FedYogi beta1")
    beta2: float = spec(0.99, lo=0.0, hi=0.9999, help="FedAdam/FedYogi beta2")
    tau: float = spec(1e-3, lo=0.0, lo_open=True, hi=1.0, help="FedAdam/FedYogi adaptivity")
    round_timeout: float = spec(
        0.0,
        lo=0.0,
        hi=86_400.0,
        help="reply deadline in s; 0: none in simulation, and for a deployed run "
        "max(120, 60 x client.local_epochs, or 0.5 x client.local_steps)",
    )
    aggregator: str = spec(
        "mean",
        choices=AGGREGATORS,
        help="how updates combine: the weighted mean, or a robust rule in the clear "
        "(median, trimmed_mean, krum, multi_krum, bulyan, norm_bound; no DP, no secagg)",
    )
    attackers_tolerated: int = spec(
        0, lo=0, hi=1_000_000, help="attackers f the robust aggregator must tolerate per round"
    )
    trim_fraction: float = spec(
        0.0,
        lo=0.0,
        hi=0.49,
        help="trimmed_mean: share of updates dropped per side; 0: exactly attackers_tolerated",
    )
    krum_select: int = spec(
        0, lo=0, hi=1_000_000, help="multi_krum: updates averaged; 0: cohort - attackers"
    )
    norm_bound: float = spec(
        0.0, lo=0.0, hi=1e6, help="norm_bound: L2 bound M each update is clipped to"
    )
    weak_dp_noise: float = spec(
        0.0,
        lo=0.0,
        hi=1e3,
        help="norm_bound: std of Gaussian noise added to the aggregate (weak DP, "
        "Sun et al. 2019; no DP guarantee)",
    )
    # Asynchronous / stale-synchronous training (docs/how-to/async-training.md).
    mode: str = spec(
        "sync",
        choices=("sync", "async", "ssp"),
        help="sync: rounds wait for their cohort; async: buffered asynchronous (FedBuff), "
        "C clients in flight, an update applied every K arrivals; ssp: async whose "
        "dispatches wait while the model is more than ssp_bound versions ahead of the "
        "oldest download in flight. In async/ssp, rounds counts applied server updates",
    )
    concurrency: int = spec(
        0, lo=0, hi=1_000_000, help="async/ssp: clients training at once C; 0: per_round"
    )
    buffer: int = spec(
        1, lo=1, hi=1_000_000, help="async/ssp: client updates K per server update (K <= C)"
    )
    staleness_exponent: float = spec(
        0.5,
        lo=0.0,
        hi=10.0,
        help="async/ssp: an update tau versions old weighs (1+tau)^-a; 0.5: FedBuff's "
        "1/sqrt(1+tau); 0: constant",
    )
    max_staleness: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="async/ssp: updates more than this many versions old are dropped and counted; "
        "0: no limit",
    )
    ssp_bound: int = spec(
        2, lo=0, hi=1_000_000, help="ssp: the staleness bound S (versions ahead of the oldest)"
    )
    group_size: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="async/ssp: clients per dispatch unit G (with secagg: one secure-aggregation "
        "session); 0: buffer K with secagg, 1 in the clear; G >= K with secagg",
    )
    max_participations: int = spec(
        0, lo=0, hi=1_000_000, help="async/ssp: most dispatches per client in a run; 0: no cap"
    )


@dataclass
class EvalConfig:
    central_every: int = spec(1, lo=0, hi=1_000_000, help="evaluate on the test set every N")
    federated_every: int = spec(0, lo=0, hi=1_000_000, help="federated evaluation every N")
    federated_clients: int = spec(10, lo=1, hi=1_000_000, help="clients per federated eval")
    client_holdout: float = spec(
        0.0, lo=0.0, hi=0.9, help="share of each client's data kept for federated evaluation"
    )
    batch_size: int = spec(256, lo=1, hi=1_000_000, help="evaluation batch size")


@dataclass
class SecAggSection:
    enabled: bool = spec(False, help="secure aggregation: the server learns only the sum")
    threat: str = spec(
        "semi_honest",
        choices=("semi_honest", "malicious"),
        help="threat model of the server; malicious: signed key adverts checked against "
        "the clients' identity roster, plus a consistency round (deployment: [secagg] "
        "roster in server.toml)",
    )
    adversarial_rate: float = spec(
        0.05, lo=0.0, hi=0.5, help="tolerated fraction of corrupt clients (derives k, t)"
    )
    dropout_rate: float = spec(
        0.1, lo=0.0, hi=0.8, help="expected fraction of clients that drop (derives k, t)"
    )
    neighbors: int = spec(0, lo=0, hi=100_000, help="neighbours per client; 0: derived")
    threshold: int = spec(0, lo=0, hi=100_000, help="Shamir threshold t; 0: derived")
    clip_range: float = spec(
        1.0, lo=0.0, lo_open=True, hi=1e6, help="update values are clipped to [-r, r]"
    )
    levels: int = spec(2**20, lo=2, hi=2**40, help="quantization levels over [-r, r]")
    max_weight: int = spec(
        0, lo=0, hi=10_000_000, help="cap on a client's weight (examples); 0: largest client"
    )
    pipeline: bool = spec(
        True,
        help="run the next round's key stages inside this round's exchanges "
        "(one extra exchange per round instead of three)",
    )
    sum_check: bool = spec(
        True,
        help="reject a round whose unmasked sum no set of honest clipped clients can produce "
        "(total weight > n x max_weight, a coordinate outside n x [-r, r], or under DP an L2 "
        "norm above n x clip); honest rounds never trip it (server/engine/sum_checks.py)",
    )


@dataclass
class DpSection:
    mechanism: str = spec(
        "none",
        choices=("none", "central", "distributed", "ftrl"),
        help="none; central (server adds Gaussian noise to the sum); distributed "
        "(clients add Skellam noise shares under secure aggregation); ftrl (DP-FTRL: the "
        "server adds noise correlated across rounds; privacy from the participation "
        "schema dp.ftrl_*, no sampling amplification)",
    )
    clip: float = spec(1.0, lo=0.0, lo_open=True, hi=1e6, help="L2 clip norm C of a client update")
    noise_multiplier: float = spec(
        0.0, lo=0.0, hi=1e4, help="noise std / C; 0 means calibrate it from epsilon"
    )
    epsilon: float = spec(0.0, lo=0.0, hi=1e4, help="privacy budget epsilon (required with DP)")
    delta: float = spec(1e-5, lo=0.0, lo_open=True, hi=0.1, help="privacy budget delta")
    neighbouring: str = spec(
        "auto",
        choices=("auto", "add_remove", "replace_one", "zero_out"),
        help="neighbouring relation; auto: replace_one for fixed sampling; for Poisson, "
        "add_remove (central) or zero_out (distributed: the client still takes part, its "
        "update replaced by zeros; hides what it sent, not that it took part)",
    )
    accountant: str = spec(
        "auto",
        choices=("auto", "pld", "prv", "rdp", "dpa_rdp", "skellam_rdp_integer", "skellam_rdp"),
        help="privacy accountant; auto: pld (central, Poisson), dpa_rdp (central, fixed), "
        "skellam_rdp_integer (distributed: the only one sound for Skellam noise, at integer "
        "Renyi orders); skellam_rdp (fractional orders, not proven) only verifies old ledgers",
    )
    adaptive_clip: bool = spec(False, help="adapt C toward a quantile of update norms")
    target_quantile: float = spec(0.5, lo=0.0, hi=1.0, help="adaptive clipping target quantile")
    clip_lr: float = spec(0.2, lo=0.0, lo_open=True, hi=10.0, help="adaptive clipping step")
    modulus_bits: int = spec(20, lo=8, hi=22, help="distributed DP: bits of the integer modulus")
    budget_against: str = spec(
        "observers",
        choices=("observers", "coordinator"),
        help="whose epsilon the budget caps: observers of the published models (amplified by "
        "secret cohorts), or the coordinator and cohort members (distributed DP only: "
        "unamplified, for a client in every released round; conservative, so that when the "
        "run stops reveals nothing of how often any client took part)",
    )
    # DP-FTRL (dp.mechanism = 'ftrl'; privacy/dp/ftrl/). Flat fields: the validator reads
    # one level of tables.
    ftrl_factorization: str = spec(
        "banded",
        choices=("tree", "banded", "blt"),
        help="DP-FTRL noise correlation: tree (binary-tree aggregation), banded (banded "
        "Toeplitz matrix factorisation, band = min_separation), blt (buffered linear Toeplitz)",
    )
    ftrl_min_separation: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="DP-FTRL participation schema: at least this many rounds between two "
        "participations of one client; 0: single participation (each client at most once)",
    )
    ftrl_max_participations: int = spec(
        1,
        lo=1,
        hi=1_000_000,
        help="DP-FTRL participation schema: at most this many participations per client "
        "(needs ftrl_min_separation > 0 when above 1)",
    )
    seeded_cohorts: bool = spec(
        False,
        help="draw DP cohorts from the public run seed (reproducible); anyone holding the run "
        "files then knows the cohorts, so the run is accounted without amplification (q = 1)",
    )


@dataclass
class SimulationConfig:
    """How the in-process engine runs clients, and how available simulated clients are."""

    workers: int = spec(
        0, lo=0, hi=1024, help="worker processes; 0: one per CPU core (1 on a GPU); 1: in-process"
    )
    vmap_clients: int = spec(
        32,
        lo=1,
        hi=4096,
        help="train up to this many same-size clients at once (torch.func.vmap, small models); "
        "1: one at a time, bit-identical to a deployed client",
    )
    dropout: float = spec(
        0.0, lo=0.0, hi=0.99, help="median chance that a client drops at each protocol stage"
    )
    dropout_spread: float = spec(
        0.0, lo=0.0, hi=10.0, help="spread (log-odds s.d.) of per-client dropout probabilities"
    )
    dropout_stages: str = spec(
        "", help="per-stage dropout overrides, e.g. 'train=0.1,evaluate=0'; others use dropout"
    )
    latency_median: float = spec(
        0.0, lo=0.0, hi=86_400.0, help="median simulated reply latency in s; 0: no latency model"
    )
    latency_sigma: float = spec(
        0.5, lo=0.0, hi=10.0, help="log-normal sigma of latency per client and stage"
    )
    latency_client_sigma: float = spec(
        0.5, lo=0.0, hi=10.0, help="log-normal sigma of each client's persistent slowness"
    )
    message_latency_share: float = spec(
        1.0,
        lo=0.0,
        hi=1.0,
        help="median latency of an exchange in which the client computes nothing on its data "
        "(secure aggregation's advertise, share-keys, consistency and unmask stages), as a "
        "share of latency_median; 1: as slow as training",
    )
    plots: bool = spec(True, help="save PNG plots of the run in the run directory")
    ray_address: str = spec(
        "",
        help="Ray cluster for transport = 'flower': '' (RAY_ADDRESS if set, else a fresh local "
        "instance), 'local', 'auto', 'host:port' (a head's GCS) or 'ray://host:port'",
    )
    client_cpus: float = spec(
        1.0, lo=0.0, lo_open=True, hi=1024.0, help="CPUs Ray reserves per Flower client"
    )
    client_gpus: float = spec(
        0.0,
        lo=0.0,
        hi=64.0,
        help="GPUs Ray reserves per Flower client (fractions share one); > 0: clients train on it",
    )


@dataclass
class TrackingConfig:
    """Experiment tracking (pip install 'fedveil[tracking]'); off unless a target is named."""

    tensorboard: str = spec(
        "", help="directory for TensorBoard event files (--tensorboard DIR); '': off"
    )
    mlflow_uri: str = spec(
        "",
        help="MLflow tracking URI (--mlflow URI): a directory or 'file:DIR' (a local file "
        "store), or a server ('http://host:5000'); '': off",
    )
    mlflow_experiment: str = spec("fedveil", help="MLflow experiment the run is logged under")


@dataclass
class AuditSection:
    """`fedveil privacy audit`: the canary audit of this run's privacy (simulation only)."""

    canaries: int = spec(
        1000,
        lo=1,
        hi=1_000_000,
        help="canaries, each inserted with probability 1/2 (the rest held out); at most the "
        "model's parameter count; the audit prints the highest epsilon this many can refute",
    )
    out: str = spec("", help="the audit's own run directory; '': <out>-audit")
    target: str = spec(
        "simulation",
        choices=("simulation", "devices"),
        help="simulation; 'devices' is refused (an audit of real devices is a further "
        "release of their data)",
    )


# Tracking URIs MLflow itself resolves; a plain path is a local file store.
MLFLOW_SCHEMES = ("file", "http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


@dataclass
class RunConfig:
    seed: int = spec(0, lo=0, hi=2**63 - 1, help="seed for data, model init, sampling")
    transport: str = spec(
        "inprocess", choices=("inprocess", "flower"), help="in-process engine or Flower"
    )
    device: str = spec("auto", choices=("auto", "cpu", "cuda"), help="where training runs")
    out: str = spec("runs/latest", help="run directory")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    secagg: SecAggSection = field(default_factory=SecAggSection)
    dp: DpSection = field(default_factory=DpSection)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    audit: AuditSection = field(default_factory=AuditSection)
    poisoning: PoisoningConfig = field(default_factory=PoisoningConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def publishes_privately(self) -> bool:
        """Whether the run's records are published as their accounted figures only
        (PUBLIC_UNDER_DP; the rest to the private annex): under any DP, DP-SGD on the
        clients alone included (a NaN noise counts as DP)."""
        return self.dp.mechanism != "none" or self.client.dp_sgd_noise != 0

    @property
    def poisson_rate(self) -> float:
        """The Poisson sampling rate q in use (explicit, or per_round / num_clients)."""
        if self.server.sample_rate > 0:
            return self.server.sample_rate
        return min(1.0, self.server.per_round / self.data.num_clients)


SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "client": ClientConfig,
    "server": ServerConfig,
    "eval": EvalConfig,
    "secagg": SecAggSection,
    "dp": DpSection,
    "simulation": SimulationConfig,
    "tracking": TrackingConfig,
    "audit": AuditSection,
    "poisoning": PoisoningConfig,
}


def _check_cross_fields(cfg: RunConfig) -> None:
    """Limits that depend on more than one field."""
    n = cfg.data.num_clients
    if cfg.server.sampling == "fixed" and cfg.server.per_round > n:
        raise ConfigError(
            f"server.per_round = {cfg.server.per_round}: more sampled clients than exist; "
            f"must be <= data.num_clients = {n}"
        )
    if cfg.server.min_clients > n:
        raise ConfigError(f"server.min_clients = {cfg.server.min_clients}: must be <= {n}")
    if cfg.client.local_epochs == 0 and cfg.client.local_steps == 0:
        raise ConfigError("client.local_epochs = 0 and client.local_steps = 0: set one of them")
    if cfg.client.dp_sgd_noise > 0 and (cfg.client.prox_mu > 0 or cfg.client.local_steps > 0):
        raise ConfigError(
            "client.dp_sgd_noise > 0: DP-SGD trains whole Poisson-sampled epochs; "
            "it cannot be combined with client.prox_mu or client.local_steps"
        )
    if cfg.eval.federated_every > 0 and cfg.eval.client_holdout == 0:
        raise ConfigError(
            "eval.federated_every > 0 needs eval.client_holdout > 0 "
            "(the share of each client's data kept for local evaluation)"
        )
    _check_dp_fields(cfg)
    check_async_fields(cfg)
    _check_simulation_fields(cfg)
    check_robust_config(cfg)
    check_poisoning(cfg)
    _check_tracking(cfg.tracking)
    task = cfg.model.task
    if task is None:
        from fedveil.models import MODELS

        if cfg.model.name not in MODELS:
            known = ", ".join(sorted(MODELS))
            raise ConfigError(
                f"model.name = {cfg.model.name!r}: unknown; choose one of {known} "
                "or give a task as 'module:function'"
            )
    if task is not None and (task.count(":") != 1 or not all(task.split(":"))):
        raise ConfigError(f"model.task = {task!r}: must look like 'package.module:function'")


def _check_dp_fields(cfg: RunConfig) -> None:
    """DP settings against each other, the sampling and secure aggregation."""
    dp = cfg.dp
    if dp.mechanism != "none" and dp.epsilon == 0:
        raise ConfigError(
            f"dp.mechanism = {dp.mechanism!r} needs a budget: set dp.epsilon > 0 (e.g. --epsilon 8)"
        )
    if (
        dp.neighbouring == "add_remove"
        and cfg.server.sampling == "fixed"
        and dp.mechanism != "none"
    ):
        raise ConfigError(
            "dp.neighbouring = 'add_remove' with server.sampling = 'fixed': no accountant bounds "
            "this pair; use Poisson sampling or replace_one"
        )
    _check_dp_soundness(cfg)
    if dp.mechanism == "distributed" and not cfg.secagg.enabled:
        raise ConfigError(
            "dp.mechanism = 'distributed' needs secure aggregation (secagg.enabled = true, "
            "--secagg): the noise shares only protect a sum the server cannot see"
        )
    if dp.budget_against == "coordinator" and dp.mechanism != "distributed":
        raise ConfigError(
            f"dp.budget_against = 'coordinator' with dp.mechanism = {dp.mechanism!r}: under "
            "central DP the coordinator is a trusted curator and no epsilon holds against it; "
            "use dp.mechanism = 'distributed' (or budget_against = 'observers')"
        )
    if dp.mechanism == "distributed" and dp.adaptive_clip:
        raise ConfigError("dp.adaptive_clip is not supported with dp.mechanism = 'distributed'")
    _check_ftrl_fields(cfg)
    _check_distributed_evaluation(cfg)


def _check_ftrl_fields(cfg: RunConfig) -> None:
    """DP-FTRL: its schema fields only with it; no distributed noise, sampling or
    adaptivity on top (correlated noise is added once, by the server)."""
    dp = cfg.dp
    ftrl_set = dp.ftrl_min_separation != 0 or dp.ftrl_max_participations != 1
    if dp.mechanism != "ftrl":
        if ftrl_set:
            raise ConfigError(
                f"dp.ftrl_min_separation = {dp.ftrl_min_separation}, "
                f"dp.ftrl_max_participations = {dp.ftrl_max_participations} with "
                f"dp.mechanism = {dp.mechanism!r}: the participation schema belongs to "
                "dp.mechanism = 'ftrl'"
                + (
                    "; distributed DP does not combine with correlated noise (each round's "
                    "noise shares are independent)"
                    if dp.mechanism == "distributed"
                    else ""
                )
            )
        return
    if dp.ftrl_max_participations > 1 and dp.ftrl_min_separation == 0:
        raise ConfigError(
            f"dp.ftrl_max_participations = {dp.ftrl_max_participations} needs "
            "dp.ftrl_min_separation >= 1 (0 means single participation)"
        )
    if dp.ftrl_min_separation > cfg.server.rounds:
        raise ConfigError(
            f"dp.ftrl_min_separation = {dp.ftrl_min_separation}: must be <= server.rounds = "
            f"{cfg.server.rounds} (use 0 for single participation)"
        )
    if cfg.server.sampling != "fixed":
        raise ConfigError(
            f"server.sampling = {cfg.server.sampling!r} with dp.mechanism = 'ftrl': DP-FTRL "
            "draws fixed-size cohorts among the clients its participation schema allows "
            "(no amplification by sampling); use server.sampling = 'fixed'"
        )
    if dp.adaptive_clip:
        raise ConfigError("dp.adaptive_clip is not supported with dp.mechanism = 'ftrl'")
    if cfg.server.mode != "sync":
        raise ConfigError(
            f"server.mode = {cfg.server.mode!r} with dp.mechanism = 'ftrl': DP-FTRL runs "
            "synchronous rounds (its noise follows the release index); use server.mode = 'sync'"
        )
    if dp.neighbouring == "add_remove":
        raise ConfigError(
            "dp.neighbouring = 'add_remove' with dp.mechanism = 'ftrl': the schema bounds "
            "participations, not presence; use 'auto' (zero_out) or 'replace_one'"
        )
    if dp.accountant not in ("auto", "pld"):
        raise ConfigError(
            f"dp.accountant = {dp.accountant!r} with dp.mechanism = 'ftrl': its epsilon is one "
            "Gaussian mechanism over the factorisation's sensitivity (PLD); use 'auto' or 'pld'"
        )


def _check_distributed_evaluation(cfg: RunConfig) -> None:
    # Federated evaluation asks each sampled client for its own accuracy and loss in the
    # clear: an un-noised release to the coordinator that distributed DP's epsilon against
    # the coordinator does not account for.
    every = cfg.eval.federated_every
    if cfg.dp.mechanism == "distributed" and every > 0:
        raise ConfigError(
            f"eval.federated_every = {every} with dp.mechanism = 'distributed': refused. "
            "Federated evaluation has each sampled client send the coordinator its own "
            "held-out accuracy, loss and example count in the clear, an un-noised release "
            "of its data that the epsilon stated against the coordinator does not cover. "
            "Set eval.federated_every = 0 (the server's test-set evaluation, "
            "eval.central_every, stays), or use dp.mechanism = 'central', where the "
            "coordinator is the trusted curator"
        )


def _check_simulation_fields(cfg: RunConfig) -> None:
    """Simulation and placement settings: dropout stages, the Ray cluster, the device."""
    if cfg.simulation.dropout_stages:
        try:
            parse_stage_dropout(cfg.simulation.dropout_stages)
        except ValueError as exc:
            raise ConfigError(f"simulation.dropout_stages: {exc}") from None
    try:
        check_ray_address(cfg.simulation.ray_address)
    except ValueError as exc:
        raise ConfigError(f"simulation.ray_address = {exc}") from None
    if cfg.transport == "flower" and cfg.device == "cuda" and cfg.simulation.client_gpus == 0:
        # Ray gives a client no GPU unless it reserves one; it would train on CPU silently.
        raise ConfigError(
            "device = 'cuda' with transport = 'flower' needs simulation.client_gpus > 0 "
            "(the GPU share Ray reserves per client; 0 means clients train on CPU)"
        )


def _check_tracking(t: TrackingConfig) -> None:
    uri = t.mlflow_uri
    scheme, sep, _ = uri.partition(":")
    # 'C:\runs' is a Windows path, not a scheme; 'x://' with an unknown scheme is a typo.
    if sep and len(scheme) > 1 and scheme.isalpha() and scheme.lower() not in MLFLOW_SCHEMES:
        raise ConfigError(
            f"tracking.mlflow_uri = {uri!r}: unknown scheme {scheme!r}; use a directory, "
            f"or one of {', '.join(s + ':' for s in MLFLOW_SCHEMES)}"
        )
    if uri and not t.mlflow_experiment.strip():
        raise ConfigError(
            f"tracking.mlflow_experiment = {t.mlflow_experiment!r}: must name an experiment "
            "when tracking.mlflow_uri is set"
        )


def _check_dp_soundness(cfg: RunConfig) -> None:
    # Only accountants proven for the mechanism (privacy/dp/vocabulary.sound_accountants).
    dp, sampling = cfg.dp, cfg.server.sampling
    if dp.mechanism in ("none", "ftrl"):  # DP-FTRL: _check_ftrl_fields
        return
    if dp.neighbouring == "zero_out" and sampling == "fixed":
        raise ConfigError(
            "dp.neighbouring = 'zero_out' with server.sampling = 'fixed': no accountant bounds "
            "this pair; use replace_one (or 'auto')"
        )
    if dp.mechanism == "distributed":
        if dp.neighbouring == "add_remove":
            fix = "replace_one" if sampling == "fixed" else "zero_out"
            raise ConfigError(
                "dp.neighbouring = 'add_remove': not sound for distributed DP (the target's "
                f"noise share leaves with it); use 'auto' or {fix!r}"
            )
        if dp.accountant == "skellam_rdp":
            raise ConfigError(
                "dp.accountant = 'skellam_rdp': evaluates the Skellam bound at fractional "
                "Renyi orders, for which it is not proven; kept only so that old ledgers "
                "verify as what they were. Use 'auto' or 'skellam_rdp_integer'"
            )
        if dp.accountant not in ("auto", "skellam_rdp_integer"):
            raise ConfigError(
                f"dp.accountant = {dp.accountant!r}: not sound for distributed DP (Skellam); "
                "use 'auto' or 'skellam_rdp_integer'"
            )
    elif dp.neighbouring == "add_remove" and sampling == "poisson" and cfg.secagg.enabled:
        # The rule of privacy/dp/vocabulary.REFUSED_NEIGHBOURING.
        raise ConfigError(
            "dp.neighbouring = 'add_remove' with dp.mechanism = 'central', secagg.enabled = "
            "true and server.sampling = 'poisson': refused. Whether a secure-aggregation "
            "round aborts depends on how many sampled clients survive, and that public abort "
            "status then depends on whether the target was sampled, which add/remove does "
            "not account for; use 'auto' (zero_out under secure aggregation) or 'zero_out'"
        )
    elif dp.accountant in ("skellam_rdp_integer", "skellam_rdp"):
        raise ConfigError(
            f"dp.accountant = {dp.accountant!r}: only for dp.mechanism = 'distributed'; "
            "use 'auto' for central DP"
        )


def parse_stage_dropout(text: str) -> dict[str, float]:
    """'train=0.1,evaluate=0' -> {'train': 0.1, 'evaluate': 0.0}; ValueError naming the item."""
    out: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        stage, sep, value = item.partition("=")
        stage = stage.strip()
        if not sep or not stage:
            raise ValueError(f"{item!r}: expected STAGE=PROBABILITY, e.g. 'train=0.1'")
        try:
            p = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value.strip()!r} is not a number") from None
        if not 0.0 <= p <= 0.99:
            raise ValueError(f"{item!r}: probability must be in [0, 0.99]")
        out[stage] = p
    return out


def config_from_dict(values: dict[str, Any]) -> RunConfig:
    cfg = build(RunConfig, values, sections=SECTIONS)
    _check_cross_fields(cfg)
    return cfg


def set_dotted(values: dict[str, Any], key: str, value: Any) -> None:
    """Set 'section.key' in a nested dict (command-line overrides)."""
    parts = key.split(".")
    node = values
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part} is not a table")
    node[parts[-1]] = value


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Read a TOML file (optional), apply dotted-key overrides, validate everything."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            values = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"--config {p}: no such file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {p}: not valid TOML ({exc})") from None
    for key, value in (overrides or {}).items():
        set_dotted(values, key, value)
    return config_from_dict(values)


def field_help() -> dict[str, str]:
    """'section.key' -> help text, for documentation and --help."""
    return help_of(RunConfig, SECTIONS)


def to_toml(cfg: RunConfig) -> str:
    """The resolved config as TOML (None values are left out, as TOML has no null)."""
    return toml_text(cfg.to_dict())


def toml_text(data: dict[str, Any]) -> str:
    """A config's values (top-level keys, then one table per section) as TOML."""
    lines: list[str] = []
    for key, value in data.items():
        if not isinstance(value, dict) and value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items() if v is not None)
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
