"""`fedveil export`: a run's model as TorchScript, a torch.export program, or ONNX."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a run's model: torchscript, exported-program or onnx",
        description="Rebuild the model of RUN_DIR (its model.safetensors) or of a safetensors "
        "file, as `fedveil serve` does, and write it as TorchScript (torch.jit.load), a "
        "torch.export ExportedProgram (torch.export.load) or ONNX (needs onnx and onnxscript: "
        "pip install 'fedveil[onnx]'). The batch dimension is dynamic; the file carries the "
        "model's metadata; the export is checked against the model on a random batch "
        "(max abs difference 1e-5) before it is reported written.",
    )
    p.add_argument("source", metavar="RUN_DIR", help="a run directory, or a .safetensors file")
    p.add_argument(
        "--format",
        dest="fmt",
        required=True,
        choices=["torchscript", "exported-program", "onnx"],
        help="what to write",
    )
    p.add_argument(
        "--out", help="file to write (default: model.pt, model.pt2 or model.onnx beside the model)"
    )
    p.add_argument(
        "--task",
        help="for a model file without metadata: MODEL, DATASET/MODEL or module:function; "
        "a custom task's model (file or run directory) loads only with its module:function "
        "named here (a model file never chooses code to import)",
    )
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from fedveil.server.serving.model_export import export_run

    out = Path(args.out) if args.out else None
    result = export_run(Path(args.source), args.fmt, out, args.task)
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(result.path),
                    "format": result.format,
                    "method": result.method,
                    "input_shape": list(result.input_shape),
                    "max_abs_diff": result.max_abs_diff,
                }
            )
        )
    else:
        print(
            f"{result.format} ({result.method}) written to {result.path}; inputs (batch, "
            f"{', '.join(map(str, result.input_shape))}), max abs difference from the model "
            f"{result.max_abs_diff:.2g}"
        )
    return 0
