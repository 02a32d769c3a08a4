"""Update inversion (issue 20, part 2): what an attacker recovers from one client's
update, from the secure sum of K clients, and from its central-DP release.

    .venv/bin/python -m fedveil.benchmarks.bench_audit_attacks --json [--seeds 3] [--images 10]

Fashion-MNIST, the built-in MLP (784-128-10) at its seeded initialisation, updates
computed through fedveil's train_local (lr 0.05). Secure aggregation reveals exactly the
sum of the cohort's updates, so the harness computes that sum in the clear. DP: each
update clipped to C = 1 and the sum noised with z (privacy/dp's clip_l2 and
add_gaussian_noise). Every figure is the median over --seeds.

The last line of stdout is one JSON object:
  inversion_psnr_plain            optimisation attack (Geiping et al. 2020), mean PSNR over
                                  --images single-image FedSGD updates (target >= 20 dB)
  inversion_psnr_plain_analytic   the analytic first-layer attack on the same updates
  inversion_psnr_secagg           Cocktail Party Attack, K = 20, b = 1, FedSGD
  inversion_psnr_secagg_curve     [{k, batch, local_steps, images, psnr, ssim,
                                  recognisable}] for K in --ks, b in --batches, local steps
                                  in --local-steps (1: FedSGD; 5: five full-batch epochs;
                                  the config default, one epoch of batch 32, IS FedSGD for
                                  clients with <= 32 examples)
  inversion_psnr_dp               the best attack on the DP-noised sum (K = 20, b = 1)
  inversion_psnr_random_baseline  matched random training images against the same images
  literature                      what the papers report, for comparison
No peer framework (Flower, NVFlare, TFF) ships an update-inversion attack; FedML ships
DLG and Inverting Gradients, not the Cocktail Party Attack.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from fedveil.benchmarks.harness import command_main
from fedveil.simulations.attacks.inversion_run import (
    Pool,
    Scenario,
    attack_scenario,
    fashion_mnist_pool,
)

LITERATURE = {
    "geiping_2020": "Inverting Gradients: single images from FC/ConvNet gradients "
    "reconstructed at high fidelity; for an FC first layer the input is recoverable exactly",
    "kariyappa_2023": "Cocktail Party Attack: recognisable images from aggregate "
    "FC-layer gradients of batches up to 1024 on a larger first layer; at most as many as "
    "the layer has units",
}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


SUMMARY = __doc__.splitlines()[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `python -m fedveil.benchmarks.bench_audit_attacks`."""
    p.add_argument("--json", action="store_true", help="print the JSON line only at the end")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--curve-seeds", type=int, default=0, help="seeds per curve point (default: --seeds)"
    )
    p.add_argument("--images", type=int, default=10, help="single-image updates per seed")
    p.add_argument("--iterations", type=int, default=300, help="gradient-matching steps")
    p.add_argument("--unmix-steps", type=int, default=500, help="Cocktail Party steps")
    p.add_argument("--ks", type=_ints, default=[2, 5, 20, 100])
    p.add_argument("--batches", type=_ints, default=[1, 8])
    p.add_argument("--local-steps", type=_ints, default=[1, 5])
    p.add_argument("--dp-noise", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (shared machine)")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pool = fashion_mnist_pool()
    seeds = list(range(args.seeds))

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    plain_opt, plain_analytic = [], []
    for seed in seeds:
        opt, ana = [], []
        for i in range(args.images):
            res = attack_scenario(
                pool,
                Scenario("plain", 1, 1, 1),
                1000 * seed + i,
                attacks=("analytic", "optimisation"),
                opt_iterations=args.iterations,
            )
            opt.append(res["attacks"]["optimisation"]["psnr"])
            ana.append(res["attacks"]["analytic"]["psnr"])
        plain_opt.append(statistics.fmean(opt))
        plain_analytic.append(statistics.fmean(ana))
        log(f"plain seed {seed}: optimisation {plain_opt[-1]:.1f} dB")

    curve = []
    for steps in args.local_steps:
        for batch in args.batches:
            for k in args.ks:
                runs = [
                    _cpa(pool, Scenario("secagg", k, batch, steps), seed, args.unmix_steps)
                    for seed in seeds[: args.curve_seeds or None]
                ]
                point = {
                    "k": k,
                    "batch": batch,
                    "local_steps": steps,
                    "images": k * batch,
                    **{key: statistics.median(r[key] for r in runs) for key in runs[0]},
                }
                curve.append(point)
                log(f"secagg {point}")

    dp, baseline = [], []
    for seed in seeds:
        res = attack_scenario(
            pool,
            Scenario("dp", 20, 1, 1, dp_noise=args.dp_noise, clip_norm=1.0),
            seed,
            attacks=("analytic", "cocktail_party"),
            cpa_steps=args.unmix_steps,
        )
        dp.append(res["psnr"])
        baseline.append(res["random_baseline_psnr"])
        log(f"dp seed {seed}: best {res['psnr']:.1f} dB, baseline {baseline[-1]:.1f} dB")

    headline = [p for p in curve if (p["k"], p["batch"], p["local_steps"]) == (20, 1, 1)]
    result: dict[str, Any] = {
        "inversion_psnr_plain": statistics.median(plain_opt),
        "inversion_psnr_plain_analytic": statistics.median(plain_analytic),
        "inversion_psnr_secagg": headline[0]["psnr"] if headline else None,
        "inversion_psnr_secagg_curve": curve,
        "inversion_psnr_dp": statistics.median(dp),
        "inversion_psnr_random_baseline": statistics.median(baseline),
        "dp_noise_multiplier": args.dp_noise,
        "seeds": args.seeds,
        "curve_seeds": args.curve_seeds or args.seeds,
        "images_per_seed": args.images,
        "iterations": args.iterations,
        "unmix_steps": args.unmix_steps,
        "literature": LITERATURE,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result))
    return 0


def _cpa(pool: Pool, sc: Scenario, seed: int, steps: int) -> dict[str, float]:
    res = attack_scenario(pool, sc, seed, attacks=("cocktail_party",), cpa_steps=steps)
    got = res["attacks"]["cocktail_party"]
    return {
        "psnr": got["psnr"],
        "ssim": got["ssim"],
        "recognisable": got["recognisable"],
        "reconstructed": got["reconstructed"],
        "random_baseline_psnr": res["random_baseline_psnr"],
    }


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_audit_attacks",
        description=SUMMARY,
        add_arguments=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
