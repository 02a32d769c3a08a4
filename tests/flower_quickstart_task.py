"""The fedveil task of the stock quickstart app (tests/flower_quickstart_app.py): the same
torch model, and the test set the server evaluates on. The server holds no client data:
the stock clients bring their own."""

from __future__ import annotations

from flower_quickstart_app import CLASSES, FEATURES, Net, test_data

from fedveil.config import RunConfig
from fedveil.tasks import ClientData, Task


def _no_client_data(cid: int) -> ClientData:
    raise RuntimeError(f"client {cid}: the stock Flower clients hold the data")


def make(cfg: RunConfig) -> Task:
    return Task(
        name="flower-quickstart",
        input_shape=(FEATURES,),
        num_classes=CLASSES,
        num_clients=cfg.data.num_clients,
        model_fn=Net,
        client_data=_no_client_data,
        test_data=test_data(),
    )
