"""A stock Flower app, written as in Flower's quickstart-pytorch (Message API), with no
fedveil import: a small torch model with a BatchNorm layer (float and integer buffers in
its state_dict) and Gaussian-blob data per partition. Also a legacy NumPyClient app.

Tests run these ClientApps against fedveil's ServerApp (fedveil.flower.server_app).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from torch import nn
from torch.nn import functional

FEATURES, CLASSES, BATCH = 8, 3, 16
CENTERS = np.random.default_rng(1234).normal(scale=2.0, size=(CLASSES, FEATURES))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = CENTERS[y] + rng.normal(size=(n, FEATURES))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def load_data(partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    return blobs(64, 100 + partition_id)


def test_data() -> tuple[torch.Tensor, torch.Tensor]:
    return blobs(300, 7)


def train_fn(model: Net, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for i in range(0, len(x) - BATCH + 1, BATCH):
            optimizer.zero_grad()
            loss = functional.cross_entropy(model(x[i : i + BATCH]), y[i : i + BATCH])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / batches


def test_fn(model: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        out = model(x)
    loss = functional.cross_entropy(out, y).item()
    return loss, (out.argmax(1) == y).float().mean().item()


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(int(context.node_config["partition-id"]))
    lr = float(msg.content["config"].get("lr", 0.1))
    train_loss = train_fn(model, x, y, epochs=1, lr=lr)
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(x)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(int(context.node_config["partition-id"]))
    loss, acc = test_fn(model, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(x)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


class LegacyClient(NumPyClient):
    """The pre-Message-API way: a NumPyClient behind a client_fn."""

    def fit(self, parameters: list, config: dict) -> tuple[list, int, dict]:
        return parameters, 1, {}


def client_fn(context: Context):
    return LegacyClient().to_client()


legacy_app = ClientApp(client_fn=client_fn)
