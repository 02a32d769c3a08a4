"""Server optimizers over the averaged client update (Reddi et al. 2021).

The averaged delta is treated as a pseudo-gradient step: FedAvg applies it
(scaled by the server learning rate), FedAvgM adds momentum, FedAdam and
FedYogi adapt a per-coordinate step size.
"""

from __future__ import annotations

import torch


class ServerOptimizer:
    name = "fedavg"

    def __init__(self, lr: float = 1.0) -> None:
        self.lr = lr

    def step(self, weights: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return weights + self.lr * delta

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        return None


class FedAvgM(ServerOptimizer):
    name = "fedavgm"

    def __init__(self, lr: float = 1.0, momentum: float = 0.9) -> None:
        super().__init__(lr)
        self.momentum = momentum
        self.velocity: torch.Tensor | None = None

    def step(self, weights: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if self.velocity is None:
            self.velocity = delta.clone()
        else:
            self.velocity.mul_(self.momentum).add_(delta)
        return weights + self.lr * self.velocity

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.velocity is None else {"velocity": self.velocity}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.velocity = state.get("velocity")


class FedAdaptive(ServerOptimizer):
    """FedAdam (yogi=False) and FedYogi (yogi=True)."""

    def __init__(self, lr: float, beta1: float, beta2: float, tau: float, *, yogi: bool) -> None:
        super().__init__(lr)
        self.beta1, self.beta2, self.tau, self.yogi = beta1, beta2, tau, yogi
        self.name = "fedyogi" if yogi else "fedadam"
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def step(self, weights: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if self.m is None or self.v is None:
            self.m = torch.zeros_like(delta)
            # tau^2 start, as in Reddi et al., keeps the first steps bounded.
            self.v = torch.full_like(delta, self.tau**2)
        self.m.mul_(self.beta1).add_(delta, alpha=1 - self.beta1)
        sq = delta * delta
        if self.yogi:
            self.v.sub_((1 - self.beta2) * sq * torch.sign(self.v - sq))
        else:
            self.v.mul_(self.beta2).add_(sq, alpha=1 - self.beta2)
        return weights + self.lr * self.m / (self.v.sqrt() + self.tau)

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.m is None or self.v is None:
            return {}
        return {"m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.m, self.v = state.get("m"), state.get("v")


def make_optimizer(
    name: str,
    *,
    lr: float = 1.0,
    momentum: float = 0.9,
    beta1: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
) -> ServerOptimizer:
    if name == "fedavg":
        return ServerOptimizer(lr)
    if name == "fedavgm":
        return FedAvgM(lr, momentum)
    if name in ("fedadam", "fedyogi"):
        return FedAdaptive(lr, beta1, beta2, tau, yogi=name == "fedyogi")
    raise ValueError(
        f"server.optimizer = {name!r}: must be one of fedavg, fedavgm, fedadam, fedyogi"
    )
