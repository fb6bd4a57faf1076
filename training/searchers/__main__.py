"""`python -m training.searchers export SRC DST`: a trained adapter folder as a shippable searcher."""

from __future__ import annotations

import argparse

from training.searchers import export_searcher


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.searchers", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="export a trained adapter folder as a shippable searcher")
    export.add_argument("source", help="an adapter folder this project trained (with searchsmith_adapter.json)")
    export.add_argument("target", help="where the searcher goes, e.g. training/searchers/smollm2-searcher")
    export.add_argument("--base-model", default="smollm2", help="the base model's name as customer files spell it")
    export.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    print(export_searcher(args.source, args.target, args.base_model, args.dtype))


if __name__ == "__main__":
    main()
