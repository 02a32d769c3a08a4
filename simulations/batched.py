"""Several clients' local training at once: torch.func.vmap over a unit of same-size clients.

For a small model most of a client's time goes to per-operation overhead
(dispatch, autograd bookkeeping, tiny kernels), not arithmetic. Training a
unit of clients as one batched computation pays that overhead once per unit.

Each client's computation is the one `client.training.train_local` does: the
same batch order (its own generator), the same SGD arithmetic (torch's
single-tensor SGD, momentum, weight decay, FedProx), the same loss bookkeeping.
Only the matrix products run batched, so results agree with one-at-a-time
training to float rounding (~1e-7 relative), not bit for bit; a unit of the
same clients always gives the same bits. The unit's size and a client's place in
it can change the last bits (MKL's batched product rounds by its operands'
alignment), so `simulation.vmap_clients` is part of a run's results; the split
(`plan_units`) depends only on sizes and ids, so a run reproduces.
`simulation.vmap_clients = 1` turns batching off.

A plain stack of Flatten, Linear and ReLU layers trained with cross-entropy (the
built-in `mlp`) skips vmap, functional_call and autograd: its batched forward is written
out with the operations vmap runs for it, and its backward with the operations autograd
runs for that forward (the weights' gradients written into buffers kept for the whole
unit), so the bits are the same (tests/simulations/test_batched_bits.py). Each client's
examples are gathered once
per epoch, and the SGD step is one torch._foreach_* call per operation for all of a
unit's parameters.

A model qualifies when a probe on real data runs under vmap (no batch norm
statistics or dropout: their state or randomness cannot be batched) and
agrees with train_local, and, on a CPU, has no convolution (batched
convolutions are slower there than one client at a time).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional

from fedveil.client.training import LocalResult, LocalTraining, LossFn, train_local
from fedveil.flat_model import FlatModel
from fedveil.tasks import ClientData


class BatchedTrainer:
    def __init__(self, model: FlatModel, loss_fn: LossFn) -> None:
        self.model, self.loss_fn = model, loss_fn
        module = model.module
        named = dict(module.named_parameters())
        named.update(dict(module.named_buffers()))
        self.trainable = [e for e in model.entries if _requires_grad(named[e.name])]
        self.fixed_entries = [e for e in model.entries if not _requires_grad(named[e.name])]

        def forward(
            params: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor], x: torch.Tensor
        ) -> torch.Tensor:
            return functional_call(module, (params, fixed), (x,))

        def loss_of(
            params: dict[str, torch.Tensor],
            fixed: dict[str, torch.Tensor],
            x: torch.Tensor,
            y: torch.Tensor,
        ) -> torch.Tensor:
            return loss_fn(forward(params, fixed, x), y)

        # The forward pass is batched with vmap; gradients come from ordinary autograd
        # through it (the gradient of the sum of the clients' losses is each client's
        # own gradient). torch.func.grad would import torch._dynamo: seconds of start-up.
        self._forward = vmap(forward, in_dims=(0, None, 0))
        self._losses = vmap(loss_of, in_dims=(0, None, 0, 0))
        # Cross-entropy under vmap runs a Python decomposition (and imports sympy); on
        # the batch's logits it is one ordinary call, each client's mean taken after.
        self._cross_entropy = loss_fn is functional.cross_entropy
        # A plain stack of layers needs neither vmap nor functional_call: its batched
        # forward is written out (_stack_forward), a tenth less CPU per step.
        self._stack = (
            _plain_stack(module) if self._cross_entropy and not self.fixed_entries else None
        )
        # Its gradients written out too (_stack_step), not by autograd: the same bits.
        self._by_hand = self._stack is not None
        self.usable = False

    def probe(self, data: ClientData, why_not: list[str] | None = None) -> bool:
        """Whether this model trains correctly under vmap (checked once, on real data)."""
        self.usable = False
        if self.model.device.type == "cpu" and any(
            isinstance(m, nn.modules.conv._ConvNd) for m in self.model.module.modules()
        ):
            return _no(why_not, "convolutions are slower batched on a CPU")
        n = min(len(data), 4)
        if n < 1:
            return _no(why_not, "the probe client has no examples")
        x, y = data.x[:n], data.y[:n]
        hp = LocalTraining(
            local_epochs=0,
            local_steps=2,
            batch_size=max(1, n // 2),
            lr=0.01,
            momentum=0.5,
            weight_decay=0.01,
        )
        start = self.model.get()
        try:
            got = self.train(start, [ClientData(x, y)] * 2, hp, [_gen(), _gen()])
            want = train_local(self.model, start, x, y, hp, self.loss_fn, _gen())
        except Exception as exc:  # any failure means: train these clients one at a time
            return _no(why_not, f"{type(exc).__name__}: {exc}")
        finally:
            self.model.set(start)
        scale = float(want.delta.abs().max()) + 1e-12
        for result in got:
            if not torch.allclose(result.delta, want.delta, rtol=1e-4, atol=1e-5 * scale):
                return _no(why_not, "batched training disagrees with train_local")
        self.usable = True
        return True

    def _stack_applies(self, x: torch.Tensor) -> bool:
        """Whether the written-out stack trains on this input: each example a vector, or
        flattened into one first (the layers' products then batch over clients alone)."""
        return self._stack is not None and (x.dim() == 3 or self._stack[0][0] == "flatten")

    def _loss(
        self,
        params: dict[str, torch.Tensor],
        fixed: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """Each client's loss on its batch: shape (clients,)."""
        if not self._cross_entropy:
            return self._losses(params, fixed, x, y)
        if self._stack_applies(x):
            logits = _stack_forward(self._stack, params, x)
        else:
            logits = self._forward(params, fixed, x)
        per_example = functional.cross_entropy(
            logits.flatten(0, 1), y.flatten(0, 1), reduction="none"
        )
        return per_example.view(y.shape[0], -1).mean(dim=1)

    def train(
        self,
        global_vector: torch.Tensor,
        clients: Sequence[ClientData],
        hp: LocalTraining,
        generators: Sequence[torch.Generator],
    ) -> list[LocalResult]:
        """train_local for every client of a unit (all with the same number of examples).

        `global_vector`: the model every client starts from, or one row per client
        (clients x d: gossip, where each client trains its own model).
        """
        count = len(clients)
        n = len(clients[0])
        if n == 0 or any(len(c) != n for c in clients):
            raise ValueError("a unit's clients must have the same, non-zero number of examples")
        device = self.model.device
        base = global_vector.to(device)
        per_client = base.dim() == 2
        if per_client and base.shape[0] != count:
            raise ValueError(f"{base.shape[0]} starting rows for a unit of {count} clients")
        # Each epoch, every client's examples are gathered once, in its own order, into
        # these: a step's batch is then a slice (no per-step gather or stacking).
        first = clients[0]
        xs = torch.empty(count, *first.x.shape, dtype=first.x.dtype, device=device)
        ys = torch.empty(count, *first.y.shape, dtype=first.y.dtype, device=device)

        def view(e: object) -> torch.Tensor:
            lo, hi = e.offset, e.offset + e.numel  # type: ignore[attr-defined]
            if per_client:
                return base[:, lo:hi].view(count, *e.shape)  # type: ignore[attr-defined]
            return base[lo:hi].view(e.shape)  # type: ignore[attr-defined]

        def shared_view(e: object) -> torch.Tensor:
            # Buffers that are not trained are the same in every row (they start equal
            # and nothing changes them): the first row's serve the whole unit.
            return view(e)[0] if per_client else view(e)

        # Matrices are kept transposed: the module then gets a transposed view, whose
        # transpose (what F.linear multiplies by) is contiguous. Batched products with
        # that layout run ~3x faster here; the SGD arithmetic is element-wise, so the
        # layout changes nothing else.
        flip = {e.name: len(e.shape) == 2 for e in self.trainable}

        def leaf_layout(t: torch.Tensor, name: str) -> torch.Tensor:
            return t.transpose(-1, -2) if flip[name] else t

        # A plain stack's gradients are written out (_stack_step) into these buffers, one
        # per parameter for the whole run, with no autograd graph; other models use autograd.
        by_hand = self._by_hand and self._stack_applies(xs)
        leaves = {}
        for e in self.trainable:
            start = leaf_layout(view(e), e.name).contiguous()  # transpose once, then copy
            if not per_client:
                start = start.expand(count, *start.shape)
            leaves[e.name] = start.clone() if by_hand else start.clone().requires_grad_()
        grad_buffers = {name: torch.empty_like(p) for name, p in leaves.items()} if by_hand else {}
        fixed = {e.name: shared_view(e) for e in self.fixed_entries}
        anchor = (
            {e.name: leaf_layout(view(e), e.name) for e in self.trainable}
            if hp.prox_mu > 0
            else None
        )
        self.model.module.train()
        total_steps = hp.steps_for(n)
        loss_sum = torch.zeros(count, device=device)
        step = 0
        names = list(leaves)
        params_list = list(leaves.values())
        anchors = None if anchor is None else [anchor[name] for name in names]
        momentum: list[torch.Tensor] = []
        while step < total_steps:
            for i, (c, g) in enumerate(zip(clients, generators, strict=True)):
                order = torch.randperm(n, generator=g).to(device)
                torch.index_select(c.x.to(device), 0, order, out=xs[i])
                torch.index_select(c.y.to(device), 0, order, out=ys[i])
            for start in range(0, n, hp.batch_size):
                if step >= total_steps:
                    break
                stop = start + hp.batch_size
                if by_hand:
                    with torch.no_grad():
                        loss = _stack_step(
                            self._stack, leaves, grad_buffers, xs[:, start:stop], ys[:, start:stop]
                        )
                        grads = [grad_buffers[name] for name in names]
                        _sgd(params_list, grads, momentum, hp, anchors)
                    loss_sum += loss
                    step += 1
                    continue
                for p in params_list:
                    p.grad = None
                params = {name: leaf_layout(p, name) for name, p in leaves.items()}
                loss = self._loss(params, fixed, xs[:, start:stop], ys[:, start:stop])
                loss.sum().backward()
                with torch.no_grad():
                    grads = [p.grad for p in params_list]
                    _sgd(params_list, grads, momentum, hp, anchors)  # type: ignore[arg-type]
                loss_sum += loss.detach()
                step += 1
        deltas = torch.empty(count, self.model.size, device=device)
        with torch.no_grad():
            for e in self.fixed_entries:
                deltas[:, e.offset : e.offset + e.numel] = 0.0
            for e in self.trainable:
                out = deltas[:, e.offset : e.offset + e.numel].view(count, *e.shape)
                torch.sub(leaf_layout(leaves[e.name], e.name), view(e), out=out)
        losses = (loss_sum / max(total_steps, 1)).tolist()  # one device sync per unit
        return [LocalResult(deltas[i], n, total_steps, losses[i]) for i in range(count)]


def _sgd(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor],
    hp: LocalTraining,
    anchors: list[torch.Tensor] | None,
) -> None:
    """torch's single-tensor SGD step (and FedProx's gradient term), on a unit at once.

    The same element-wise operations in the same order as torch.optim.SGD with
    foreach=False, one call for all of a unit's parameters (torch._foreach_*):
    the results are the same bits. `momentum`: the buffers, empty before the first step.
    """
    if anchors is not None:
        torch._foreach_add_(grads, torch._foreach_sub(params, anchors), alpha=hp.prox_mu)
    if hp.weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=hp.weight_decay)
    if hp.momentum != 0:
        if not momentum:
            momentum.extend(g.detach().clone() for g in grads)
        else:
            torch._foreach_mul_(momentum, hp.momentum)
            torch._foreach_add_(momentum, grads, alpha=1.0)
        grads = momentum
    torch._foreach_add_(params, grads, alpha=-hp.lr)


# A stack's layers: (kind, parameter prefix); kinds "flatten", "linear", "relu".
Stack = list[tuple[str, str]]


def _plain_stack(module: nn.Module) -> Stack | None:
    """The layers of an nn.Sequential of Flatten (its default dims), Linear and ReLU only
    (the built-in `mlp`, say), or None for any other model."""
    if type(module) is not nn.Sequential:
        return None
    layers: Stack = []
    for name, m in module.named_children():
        if type(m) is nn.Flatten and (m.start_dim, m.end_dim) == (1, -1):
            layers.append(("flatten", name))
        elif type(m) is nn.Linear:
            layers.append(("linear", name))
        elif type(m) is nn.ReLU:
            layers.append(("relu", name))
        else:
            return None
    return layers if any(kind == "linear" for kind, _ in layers) else None


def _stack_forward(layers: Stack, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A unit's logits (clients x batch x classes) through a plain stack: the operations
    vmap runs for F.linear on batched weights (a batched product with the transposed
    weight, then the bias added), so the same bits, without vmap's and
    functional_call's per-step overhead. x: clients x batch x features."""
    h = x
    for kind, name in layers:
        if kind == "flatten":  # Flatten(1, -1) of each example: every dim after the batch's
            h = h.flatten(2)
        elif kind == "linear":
            h = torch.matmul(h, params[f"{name}.weight"].transpose(-1, -2))
            bias = params.get(f"{name}.bias")
            if bias is not None:
                h = h + bias.unsqueeze(1)
        else:
            h = torch.relu(h)
    return h


def _stack_step(
    layers: Stack,
    leaves: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """One step's forward and backward through a plain stack with cross-entropy, written
    out: each client's loss (shape (clients,)), and every parameter's gradient written into
    `grads` (the weights' straight into their buffers). Call under torch.no_grad().

    The operations, operands and layouts are those autograd runs for `_stack_forward`
    and `_loss` (derivatives.yaml: bmm, threshold_backward for ReLU, the bias's sum over
    the batch, _log_softmax_backward_data, nll_loss's scatter of -1/batch), so the
    gradients are the same bits, without the graph and with no weight-sized allocation
    per step. `leaves`: the unit's parameters in the trainer's layout (matrices as
    clients x in x out); x: clients x batch x ...; y: clients x batch."""
    count = x.shape[0]
    h = x
    tape: list[tuple[str, str, torch.Tensor]] = []  # (kind, name, the layer's saved tensor)
    for kind, name in layers:
        if kind == "flatten":
            h = h.flatten(2)
        elif kind == "linear":
            tape.append((kind, name, h))  # its input: the weight's gradient needs it
            h = torch.matmul(h, leaves[f"{name}.weight"])
            bias = leaves.get(f"{name}.bias")
            if bias is not None:
                h = h + bias.unsqueeze(1)
        else:
            h = torch.relu(h)
            tape.append((kind, name, h))  # its output: ReLU's backward masks by it
    logits = h.flatten(0, 1)
    log_probs = torch.log_softmax(logits, 1)
    target = y.flatten(0, 1)
    per_client = functional.nll_loss(log_probs, target, reduction="none").view(count, -1)
    loss = per_client.mean(dim=1)
    # Backward of loss.sum(): each example's loss gets 1/batch (mean's backward), its
    # log-probability of the target minus that (nll_loss's), then log-softmax's backward.
    batch = per_client.shape[1]
    g_example = torch.ones((), device=x.device).expand(count).unsqueeze(1).expand(count, batch)
    g_example = g_example / batch
    g_log_probs = torch.zeros_like(log_probs)
    g_log_probs.scatter_(1, target.unsqueeze(1), -g_example.reshape(-1, 1))
    g = torch._log_softmax_backward_data(g_log_probs, log_probs, 1, log_probs.dtype)
    g = g.view(count, batch, -1)
    first_linear = next(i for i, (kind, _, _) in enumerate(tape) if kind == "linear")
    for i in range(len(tape) - 1, first_linear - 1, -1):
        kind, name, saved = tape[i]
        if kind == "relu":
            g = torch.ops.aten.threshold_backward(g, saved, 0)
            continue
        weight = leaves[f"{name}.weight"]
        if f"{name}.bias" in leaves:  # the broadcast add's backward: a sum over the batch
            grads[f"{name}.bias"].copy_(g.sum([1], keepdim=True).squeeze(1))
        torch.bmm(saved.transpose(1, 2), g, out=grads[f"{name}.weight"])
        if i > first_linear:  # the first layer's input needs no gradient
            g = g.bmm(weight.transpose(1, 2))
    return loss


def _requires_grad(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter) and t.requires_grad


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0x5EED)


def _no(why_not: list[str] | None, reason: str) -> bool:
    if why_not is not None:
        why_not.append(reason)
    return False
