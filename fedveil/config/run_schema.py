"""The run config's schema: one dataclass per TOML section, and `RunConfig` holding them.

Each field carries its default, limits and help (`spec`), so the schema is the one
place a setting is declared. It imports no validator: the checks that need more than
one field (run.py, and the sub-validators async_mode.py, robust_bounds.py,
poisoning_checks.py, ...) import this module, never the other way round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedveil.config.gossip import AGGREGATIONS, GossipConfig
from fedveil.config.validator import spec
from fedveil.protocol.dp_parameters import DpParameters
from fedveil.protocol.dp_rules import ACCOUNTANTS, AUTO, MECHANISM_OF_CONFIG, NEIGHBOURING_RELATIONS

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_bound")


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
    name: str = spec("cnn", help="built-in model (logreg, mlp, cnn, cnn-wide)")
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
    group_release_at: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="async/ssp with secagg: a group of G releases at its first R masked inputs, "
        "the rest left out by design and their masks removed by dropout recovery; 0: "
        "every member (or the deadline). 3 <= R <= G, R >= the Shamir threshold, G - R "
        "within secagg.dropout_rate x G",
    )
    group_dispatch_at: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="async/ssp with secagg on the simulated clock: a group is dispatched once S "
        "training slots are free, its other G - S members starting to train as slots come "
        "free (rolling dispatch; its keys agreed when it forms); 0: G, the whole group at "
        "once. The same session, R and threshold either way; 1 <= S <= G",
    )
    group_member_model: str = spec(
        "dispatch",
        choices=("dispatch", "start"),
        help="async/ssp with secagg, rolling dispatch (server.group_dispatch_at < G) on "
        "the simulated clock, without DP: the model a group member trains on. dispatch: "
        "the version the group went out with; start: the version current when the member "
        "starts to train (late members train on newer models; the released sum of deltas "
        "is weighted by its oldest member's staleness). The same session, R and threshold "
        "either way",
    )
    group_start_order: str = spec(
        "client_id",
        choices=("client_id", "random"),
        help="async/ssp rolling dispatch (server.group_dispatch_at < G): the order in "
        "which a group's members take the slots as they come free. client_id: the lowest "
        "ids first (the same members start last, and with a release at R are left out, "
        "every time); random: drawn per dispatch from the run seed (under DP from the "
        "secret cohort key)",
    )
    group_unmask: str = spec(
        "survivors",
        choices=("survivors", "threshold"),
        help="async/ssp with secagg (semi-honest), in simulation and on devices: when a "
        "group's unmask stage ends. survivors: once every survivor has sent its shares (or the "
        "deadline); threshold: at the first t replies, enough to reconstruct every secret "
        "when each member holds shares of every other (the neighbour graph is complete); "
        "the later replies are not waited for. The same sum, members, R and t either way",
    )
    max_participations: int = spec(
        0, lo=0, hi=1_000_000, help="async/ssp: most dispatches per client in a run; 0: no cap"
    )
    aggregation: str = spec(
        "coordinator",
        choices=AGGREGATIONS,
        help="coordinator: the round engine sums (secure aggregation optional); allreduce: "
        "every client is a silo and the silos sum masked updates among themselves "
        "(torch.distributed, no coordinator); gossip: no server, each client mixes its "
        "model with its neighbours' ([gossip])",
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
    split: str = spec(
        "all",
        choices=("all", "validation", "test"),
        help="which part of the test set central evaluation reads: all of it, or one of two "
        "fixed disjoint halves (validation: for tuning settings; test: for reporting them)",
    )


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
        choices=("none", *MECHANISM_OF_CONFIG),
        help="none; central (server adds Gaussian noise to the sum); distributed "
        "(clients add Skellam noise shares under secure aggregation); ftrl (DP-FTRL: the "
        "server adds noise correlated across rounds; privacy from the participation "
        "schema dp.ftrl_*, no sampling amplification)",
    )
    clip_norm: float = spec(
        1.0, lo=0.0, lo_open=True, hi=1e6, help="L2 clip norm C of a client update (was dp.clip)"
    )
    noise_multiplier: float = spec(
        0.0, lo=0.0, hi=1e4, help="noise std / C; 0 means calibrate it from epsilon"
    )
    epsilon: float = spec(0.0, lo=0.0, hi=1e4, help="privacy budget epsilon (required with DP)")
    delta: float = spec(1e-5, lo=0.0, lo_open=True, hi=0.1, help="privacy budget delta")
    neighbouring: str = spec(
        "auto",
        choices=(AUTO, *NEIGHBOURING_RELATIONS),
        help="neighbouring relation; auto: replace_one for fixed sampling; for Poisson, "
        "add_remove (central) or zero_out (distributed: the client still takes part, its "
        "update replaced by zeros; hides what it sent, not that it took part)",
    )
    accountant: str = spec(
        "auto",
        choices=(AUTO, *ACCOUNTANTS),
        help="privacy accountant; auto: pld (central, Poisson), dpa_rdp (central, fixed), "
        "skellam_rdp_integer (distributed: the only one sound for Skellam noise, at integer "
        "Renyi orders); skellam_rdp (fractional orders, not proven) only verifies old ledgers",
    )
    adaptive_clipping: bool = spec(
        False, help="adapt C toward a quantile of update norms (was dp.adaptive_clip)"
    )
    target_quantile: float = spec(0.5, lo=0.0, hi=1.0, help="adaptive clipping target quantile")
    clip_learning_rate: float = spec(
        0.2, lo=0.0, lo_open=True, hi=10.0, help="adaptive clipping step (was dp.clip_lr)"
    )
    modulus_bits: int = spec(20, lo=8, hi=22, help="distributed DP: bits of the integer modulus")
    budget_against: str = spec(
        "observers",
        choices=("observers", "coordinator"),
        help="whose epsilon the budget caps: observers of the published models (amplified by "
        "secret cohorts), or the coordinator and cohort members (distributed DP only: "
        "unamplified, for a client in every released round; conservative, so that when the "
        "run stops reveals nothing of how often any client took part)",
    )
    seeded_cohorts: bool = spec(
        False,
        help="draw DP cohorts from the public run seed (reproducible); anyone holding the run "
        "files then knows the cohorts, so the run is accounted without amplification (q = 1)",
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

    # The earlier attribute names, for code written against them (the TOML keys of the
    # same names are mapped by `renamed_keys`, with a warning). The ledger's opening
    # record keeps its keys 'clip' and 'adaptive_clip' (server/engine/ledger_opening.py).
    @property
    def clip(self) -> float:
        """Deprecated spelling of `clip_norm`."""
        return self.clip_norm

    @clip.setter
    def clip(self, value: float) -> None:
        self.clip_norm = value

    @property
    def adaptive_clip(self) -> bool:
        """Deprecated spelling of `adaptive_clipping`."""
        return self.adaptive_clipping

    @adaptive_clip.setter
    def adaptive_clip(self, value: bool) -> None:
        self.adaptive_clipping = value

    @property
    def clip_lr(self) -> float:
        """Deprecated spelling of `clip_learning_rate`."""
        return self.clip_learning_rate

    @clip_lr.setter
    def clip_lr(self, value: float) -> None:
        self.clip_learning_rate = value


@dataclass
class SimulationConfig:
    """How the in-process engine runs clients, and how available simulated clients are."""

    workers: int = spec(
        0,
        lo=0,
        hi=1024,
        help="worker processes, at most data.num_clients; 0: one per CPU core (1 on a GPU); "
        "1: in-process",
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
    absent_clients: str = spec(
        "",
        help="clients that never answer, e.g. '3,57': each drops at the first stage it is "
        "asked (a deployed round's dropouts replayed, so the simulation sums the cohort "
        "that round aggregated)",
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


ATTACKS = ("none", "label_flip", "sign_flip", "gaussian", "scaled", "backdoor")


@dataclass
class PoisoningConfig:
    """Which clients attack and how (simulation only; refused by the coordinator)."""

    attack: str = spec(
        "none",
        choices=ATTACKS,
        help="attack of the malicious clients: label_flip, sign_flip (update x -scale), "
        "gaussian (update replaced by N(0, std^2) noise), scaled (model replacement: backdoor "
        "data, update x scale), backdoor (pixel-pattern trigger relabelled to target_class, "
        "update x boost); 'none': no attackers",
    )
    fraction: float = spec(
        0.1,
        lo=0.0,
        hi=1.0,
        help="share of the population that attacks (a seeded choice, recorded in "
        "poisoning.json); 0 with an attack set: a clean run that still measures "
        "backdoor accuracy",
    )
    scale: float = spec(
        10.0, lo=0.0, lo_open=True, hi=1e6, help="sign_flip and scaled: the update's factor"
    )
    std: float = spec(1.0, lo=0.0, lo_open=True, hi=1e6, help="gaussian: noise std per coordinate")
    boost: float = spec(1.0, lo=0.0, lo_open=True, hi=1e6, help="backdoor: the update's factor")
    target_class: int = spec(0, lo=0, hi=1_000_000, help="backdoor and scaled: the target label")
    trigger_size: int = spec(
        3, lo=1, hi=64, help="the trigger: a square of this many pixels a side (bottom right)"
    )
    poison_share: float = spec(
        0.5,
        lo=0.0,
        lo_open=True,
        hi=1.0,
        help="backdoor and scaled: share of an attacker's examples given the trigger",
    )


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
    gossip: GossipConfig = field(default_factory=GossipConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def publishes_privately(self) -> bool:
        """Whether the run's records are published as their accounted figures only
        (PUBLIC_UNDER_DP; the rest to the private annex): under any DP, DP-SGD on the
        clients alone included (a NaN noise counts as DP)."""
        return self.dp.mechanism != "none" or self.client.dp_sgd_noise != 0

    def dp_parameters(self) -> DpParameters:
        """The plain values the privacy layer computes this run's DP plan from."""
        dp, s, sa = self.dp, self.server, self.secagg
        return DpParameters(
            mechanism=dp.mechanism,
            clip_norm=dp.clip_norm,
            noise_multiplier=dp.noise_multiplier,
            epsilon=dp.epsilon,
            delta=dp.delta,
            neighbouring=dp.neighbouring,
            accountant=dp.accountant,
            adaptive_clipping=dp.adaptive_clipping,
            target_quantile=dp.target_quantile,
            clip_learning_rate=dp.clip_learning_rate,
            modulus_bits=dp.modulus_bits,
            seeded_cohorts=dp.seeded_cohorts,
            ftrl_factorization=dp.ftrl_factorization,
            ftrl_min_separation=dp.ftrl_min_separation,
            ftrl_max_participations=dp.ftrl_max_participations,
            rounds=s.rounds,
            sampling=s.sampling,
            per_round=s.per_round,
            sample_rate=s.sample_rate,
            poisson_rate=self.poisson_rate,
            mode=s.mode,
            group_size=self.group_size,
            group_release_at=s.group_release_at,
            buffer=s.buffer,
            max_participations=s.max_participations,
            secure_aggregation=sa.enabled,
            adversarial_rate=sa.adversarial_rate,
            dropout_rate=sa.dropout_rate,
            threat=sa.threat,
            neighbors=sa.neighbors,
            threshold=sa.threshold,
        )

    @property
    def group_size(self) -> int:
        """G: clients per dispatch unit (server.group_size; 0: K under secagg, else 1)."""
        s = self.server
        if s.group_size:
            return s.group_size
        return s.buffer if self.secagg.enabled else 1

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
    "gossip": GossipConfig,
}
