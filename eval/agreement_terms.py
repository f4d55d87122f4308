"""Size of the agreement term next to the NLL of trained hmm0/hmm1 model directories.

For each MODEL_DIR (both directions, best checkpoint) and the first --batches training batches
of the encoded corpus of the first one (seeded token-bounded batches, as training draws them),
prints per decoder token of both directions: NLL fwd, NLL rev and Σ(γ_fwd − γ_revᵀ)² (weight 1;
aligner/training/agreement.py), in eval mode.

    python eval/agreement_terms.py runs/enfr-hmm1-guided runs/enfr-agree1-guided
"""
from __future__ import annotations

import os

import click


@click.command()
@click.argument("model_dirs", nargs=-1, required=True)
@click.option("--batches", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=1200, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=7, show_default=True, type=int)
def main(model_dirs, batches: int, max_tokens: int, seed: int) -> None:
    from aligner.training.agreement import AgreementPair
    from aligner.config import RunConfig
    from aligner.data import EncodedCorpus, TokenBatcher, make_batch
    from aligner.model_dir import (CORPUS_DIR, build_direction_model, config_path,
                                   load_params, params_path)

    corpus = EncodedCorpus.open(os.path.join(model_dirs[0], CORPUS_DIR))
    batcher = TokenBatcher.from_corpus(corpus, max_tokens, seed=seed, shuffle=True)
    chosen = [indices for _, indices in zip(range(batches), iter(batcher))]
    for model_dir in model_dirs:
        config = RunConfig.load(config_path(model_dir))
        models = {}
        for direction in ("fwd", "rev"):
            models[direction] = build_direction_model(config, direction)
            load_params(models[direction], params_path(model_dir, direction, "best"))
        pair = AgreementPair(models["fwd"], models["rev"], 1.0).eval()
        totals = {}
        for indices in chosen:
            batch = make_batch([corpus.source(i) for i in indices],
                               [corpus.target(i) for i in indices], "fwd")
            terms = pair.terms(batch.src, batch.tgt_in, batch.tgt_out)
            for name, value in terms.items():
                totals[name] = totals.get(name, 0.0) + float(value.detach())
        tokens = totals.pop("tokens")
        click.echo(f"{model_dir}\t" + "\t".join(f"{name} {value / tokens:.4f}"
                                                for name, value in totals.items()))


if __name__ == "__main__":
    main()
