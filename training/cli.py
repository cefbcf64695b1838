"""``lumotree train``: ``organism`` (the recipe of :mod:`~lumotree.training.organism`) and ``mtp`` (a fresh MTP
head for a frozen target).

    lumotree train organism --out DIR [--device cuda] [--seconds N | --steps N] [--seed S] [--checkpoint-dir DIR]
                            [--resume] [--packages a,b,...]
    lumotree train mtp --model DIR --out DIR [--device cuda] [--seconds N | --steps N] [--seed S]
    lumotree train eagle --model DIR [--out DIR] [--device cuda] [--seconds N | --steps N] [--seed S]
    lumotree train router --model DIR [--eagle DIR] [--out FILE] [--device cuda] [--per-workload N]
    lumotree train card --model DIR      # redraw loss_curve.png and README.md from recipe.json and training_log.json
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    organism = sub.add_parser("organism", help="train the organism from scratch (corpus, tokenizer, model, card)")
    mtp = sub.add_parser("mtp", help="train a fresh MTP head for the frozen model in --model")
    mtp.add_argument("--model", required=True, metavar="DIR", help="the target's checkpoint directory")
    eagle = sub.add_parser("eagle", help="train an EAGLE-style draft head on the frozen model's own outputs "
                           "(saved in DIR/eagle unless --out)")
    eagle.add_argument("--model", required=True, metavar="DIR", help="the target's checkpoint directory")
    eagle.add_argument("--out", metavar="DIR", help="where the head is written (default: DIR/eagle)")
    eagle.add_argument("--device", default="cuda", help="torch device")
    eagle_len = eagle.add_mutually_exclusive_group()
    eagle_len.add_argument("--seconds", type=_positive(float), help="training time budget (default 300 s)")
    eagle_len.add_argument("--steps", type=_positive(int), help="exact step count")
    eagle.add_argument("--seed", type=int, default=0, help="seed of the head's initialisation and the data order")
    eagle.add_argument("--batch-size", type=_positive(int), default=16)
    eagle.add_argument("--seq-len", type=_positive(int), default=256)
    router = sub.add_parser("router", help="fit the router's payoff model on drafts recorded from engine runs on "
                            "the training workloads")
    router.add_argument("--model", required=True, metavar="DIR", help="the target's checkpoint directory")
    router.add_argument("--eagle", metavar="DIR", help="the EAGLE head the router pairs with the cache drafter "
                        "(default: DIR/eagle if present, else the checkpoint's MTP head)")
    router.add_argument("--out", metavar="FILE", help="where the payoff model is written (default: DIR/router.json)")
    router.add_argument("--device", default="cuda", help="cuda: the optimized backend; cpu: the reference backend")
    router.add_argument("--per-workload", type=_positive(int), default=8, help="prompts per training workload")
    router.add_argument("--max-new-tokens", type=_positive(int), default=128)
    router.add_argument("--seed", type=int, default=0)
    card = sub.add_parser("card", help="redraw an organism's loss curve and model card from its recipe.json and "
                          "training_log.json (e.g. where matplotlib was missing at training time)")
    card.add_argument("--model", required=True, metavar="DIR", help="the organism's directory")
    for p in (organism, mtp):
        p.add_argument("--out", required=True, metavar="DIR", help="where the checkpoint and its files are written")
        p.add_argument("--device", default="cuda", help="torch device (cuda: fla's chunk kernel for GDN layers)")
        length = p.add_mutually_exclusive_group()
        length.add_argument("--seconds", type=_positive(float), help="time budget (organism: corpus, tokenizer, "
                            "encoding and training together; mtp: training); the step count is measured during "
                            "warm-up and recorded (default: a training loop of 300 s)")
        length.add_argument("--steps", type=_positive(int), help="exact step count (reproducible)")
        p.add_argument("--seed", type=int, default=0, help="seed of the initialisation, the data order and the split "
                       "of edit / tool examples")
        p.add_argument("--packages", default=None, help="comma-separated installed packages whose sources join the "
                       "corpus (default: the recipe's pinned list)")
    organism.add_argument("--checkpoint-dir", metavar="DIR", help="where checkpoint.pt (model and optimizer) is "
                          "saved during training")
    organism.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir's checkpoint.pt")


def _card(model_dir: str) -> int:
    import json
    from pathlib import Path

    from .organism import plot_loss_curve, write_model_card

    out = Path(model_dir)
    for name in ("recipe.json", "training_log.json"):
        if not (out / name).is_file():
            raise FileNotFoundError(f"--model {model_dir}: no {name}")
    rows = json.loads((out / "training_log.json").read_text())["rows"]
    write_model_card(out, json.loads((out / "recipe.json").read_text()), plot_loss_curve(rows, out / "loss_curve.png"))
    print(f"wrote {out / 'README.md'}")
    return 0


def _drafter_training(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise ValueError(f"--seed = {args.seed} must be >= 0")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: CUDA is not available on this machine (use --device cpu)")
    if args.what == "eagle":
        from .eagle import EagleTraining, train_eagle

        cfg = EagleTraining(steps=args.steps, seconds=None if args.steps else (args.seconds or 300.0),
                            batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
        record = train_eagle(args.model, args.out, cfg=cfg, device=args.device)
        held = record["heldout"]
        print(f"wrote {record['out']}: held-out loss {held['loss']:.4g}, top-1 agreement {held['agreement']:.3f} "
              f"(untrained {record['heldout_before']['agreement']:.3f})")
        return 0
    from lumotree.optimized.engine.router_training import train_router

    record = train_router(args.model, eagle=args.eagle, out=args.out, device=args.device,
                          per_workload=args.per_workload, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"wrote {record['out']}: {record['records']} recorded drafts, in-sample mean absolute error "
          f"{record['mae']}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.what == "card":
        return _card(args.model)
    if args.what in ("eagle", "router"):
        return _drafter_training(args)
    from .organism import ORGANISM_TRAINING, RECIPE, train_mtp, train_organism

    if args.seed < 0:
        raise ValueError(f"--seed = {args.seed} must be >= 0")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: CUDA is not available on this machine (use --device cpu)")
    recipe = dict(RECIPE)
    if args.packages is not None:
        recipe["packages"] = tuple(p for p in args.packages.split(",") if p)
    if args.what == "organism":
        if args.resume and not args.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        record = train_organism(args.out, device=args.device, seconds=args.seconds, steps=args.steps, seed=args.seed,
                                checkpoint_dir=args.checkpoint_dir, resume=args.resume, recipe=recipe)
    else:
        seconds = args.seconds if args.seconds or args.steps else ORGANISM_TRAINING.seconds
        record = train_mtp(args.model, args.out, device=args.device, seconds=seconds, steps=args.steps,
                           seed=args.seed, recipe=recipe)
    held = record.get("heldout") or {}
    summary = ", ".join(f"{k} {v:.4g}" for k, v in held.items() if isinstance(v, float))
    print(f"wrote {args.out}: held-out {summary}")
    return 0
