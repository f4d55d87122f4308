"""`align train`: preprocess a bitext and train an alignment model in both directions.

The command only parses options: aligner.training.builder.build_job makes the job of them
(every default the recipe's, aligner/training/recipe.py), which trains as its kind does: in
self-training rounds (aligner.training.rounds.train_rounds), or, for a kind trained on a
frozen base, in stages (aligner.training.recipe_guide.train_layer). torch is imported inside
the command function so that other commands start fast.
"""
from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

import click

from aligner import constants as C
from aligner.training import recipe
from aligner.cli.options import (INPUT, FiniteFloat, agreement_weight_option, bitext_options,
                                 join_lines_option, lowercase_option,
                                 bpe_merges_option, deterministic_option, device_option,
                                 guide_options, lr_option, max_epochs_option, max_tokens_option,
                                 max_updates_option, model_dir_option, model_kind_option,
                                 KNOWN_KINDS,
                                 model_option_option,
                                 overwrite_option, precision_option, quiet_option,
                                 recipe_summary, resume_option, rounds_option, seed_option,
                                 self_training_options, threads_option, warmup_option)
from aligner.config import DataConfig, TrainConfig
from aligner.prep import PrepConfig
from aligner.utils import AlignerError, check_condition

if TYPE_CHECKING:  # pragma: no cover
    from aligner.formats import Bitext, GoldAlignment

#: the kinds of the registry aligner.models.MODELS (which decides), spelled out so that the
#: help needs no torch import; tests/test_model_contract.py checks that the two agree


def _small(key: str) -> str:
    """A model flag's default for the recipe's kind on a small bitext, for its help."""
    return (f" ({recipe.SMALL_MODEL_OPTIONS[key]:g} for {recipe.MODEL_KIND} where the "
            f"self-training rounds repeat their epochs {recipe.SMALL_MODEL_REPEATS}+ times: "
            f"a bitext of under {recipe.ROUND_MIN_PAIRS // (recipe.SMALL_MODEL_REPEATS - 1):,} "
            f"lines)")


def parse_directions(value: str) -> Tuple[str, ...]:
    """'fwd,rev' -> ('fwd', 'rev'); each direction once, from constants.DIRECTIONS."""
    directions = tuple(part.strip() for part in value.split(",") if part.strip())
    check_condition(bool(directions) and all(d in C.DIRECTIONS for d in directions)
                    and len(set(directions)) == len(directions),
                    f"--directions must be fwd, rev or fwd,rev (got '{value}')")
    return directions


def parse_key_values(pairs: Sequence[str], option: str) -> Dict[str, Any]:
    """KEY=VALUE strings -> dict; VALUE is read as JSON when it parses (3, 0.5, true), else text."""
    values: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        check_condition(bool(sep) and bool(key.strip()),
                        f"{option} expects KEY=VALUE, got '{pair}'")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        check_condition(not isinstance(value, float) or math.isfinite(value),
                        f"{option} {pair}: not a finite number")
        values[key.strip().replace("-", "_")] = value
    return values


def check_gold_in_range(gold: Sequence["GoldAlignment"], name: str, gold_format: str,
                        bitext: "Bitext") -> None:
    """Refuse (one line, FILE:LINE for talp, FILE: sentence N for naacl) a gold link outside
    its validation sentence pair."""
    from aligner.cli.score_aer import _check_naacl_range
    from aligner.formats import check_alignments_against_bitext

    if gold_format == "talp":
        check_alignments_against_bitext([g.possible for g in gold], name, bitext)
        return
    for number, (links, src, tgt) in enumerate(zip(gold, bitext.source, bitext.target), 1):
        _check_naacl_range(links.possible, len(src), len(tgt), name, number)


def set_threads(threads: int) -> None:
    """torch.set_num_threads(threads) unless 0 (keep torch's default)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


#: `align train --help`: what the command trains with no flags, from the recipe's values
HELP = f"""Train an alignment model (both directions by default) into MODEL_DIR.

Example: align train -s train.en -t train.fr -o model   (the recipe of
aligner/training/recipe.py)

With no model flags this trains the recipe: {recipe_summary()}. Each round is a model
directory of its own (MODEL_DIR/rounds/N, with the links that guide the next round in
links.align); MODEL_DIR holds the last round's model, and align extract MODEL_DIR gives the
recipe's alignments (its -H and threshold are recorded there).

Under torchrun (e.g. torchrun --nproc_per_node 4 -m aligner train ...) the same recipe
runs on all processes: training with DistributedDataParallel, the alignments between
rounds sharded over the ranks; rank 0 writes the model directory.
"""


def check_bitext_args(source: Optional[str], target: Optional[str], joint: Optional[str],
                      what: str) -> None:
    """One error line unless exactly -s and -t, or -i alone, were given for `what`."""
    check_condition((source is None) == (target is None),
                    "give both -s/--source and -t/--target, or -i/--input")
    check_condition((source is None) != (joint is None),
                    f"give {what} as -s/-t or as -i, not both (and not neither)")


@click.command("train", help=HELP)
@bitext_options
@model_dir_option("-o", required=True)
@model_kind_option()
@click.option("--directions", default="fwd,rev", show_default=True,
              help="Directions to train: fwd = p(target|source), rev = p(source|target).")
# preprocessing
@click.option("--tokenize/--no-tokenize", default=PrepConfig.tokenize, show_default=True,
              help="Moses-tokenize raw text (sacremoses, no escaping). Off: input is tokenized.")
@click.option("--src-lang", default=PrepConfig.src_lang, show_default=True,
              help="Source language (tokenizer).")
@click.option("--tgt-lang", default=PrepConfig.tgt_lang, show_default=True,
              help="Target language (tokenizer).")
@lowercase_option()
@bpe_merges_option()
@click.option("--joint-bpe/--separate-bpe", default=PrepConfig.joint_bpe, show_default=True,
              help="Learn one BPE on both languages, or one per language.")
@click.option("--bpe-min-frequency", default=PrepConfig.bpe_min_frequency, show_default=True,
              type=click.IntRange(min=1))
@click.option("--bpe-sample", default=PrepConfig.bpe_sample_sentences, show_default=True,
              type=click.IntRange(min=0),
              help="Learn BPE on a seeded sample of this many pairs (0 = all).")
@click.option("--max-len", default=None, type=click.IntRange(min=1),
              help=f"Skip training pairs with a side longer than this (subwords).  [default: "
                   f"{recipe.TRAIN_MAX_LEN} for {recipe.MODEL_KIND}, the recipe's kind; "
                   f"{DataConfig.max_len} for the others]")
@click.option("--max-ratio", default=DataConfig.max_ratio, show_default=True,
              type=FiniteFloat(min=0),
              help="Skip training pairs whose subword length ratio exceeds this (0 = off).")
# model size
@click.option("--d-model", default=recipe.MODEL_OPTIONS["d_model"], show_default=True,
              type=click.IntRange(min=1),
              help="Model (embedding) dimension" + _small("d_model") + ".")
@click.option("--heads", default=recipe.MODEL_OPTIONS["n_heads"], show_default=True,
              type=click.IntRange(min=1),
              help="Attention heads.")
@click.option("--encoder-layers", default=recipe.MODEL_OPTIONS["enc_layers"], show_default=True,
              type=click.IntRange(min=1), help="Encoder layers" + _small("enc_layers") + ".")
@click.option("--decoder-layers", default=recipe.MODEL_OPTIONS["dec_layers"], show_default=True,
              type=click.IntRange(min=1), help="Decoder layers" + _small("dec_layers") + ".")
@click.option("--ff-dim", default=recipe.MODEL_OPTIONS["d_ff"], show_default=True,
              type=click.IntRange(min=1),
              help="Hidden size of the feed-forward blocks" + _small("d_ff") + ".")
@click.option("--dropout", default=recipe.MODEL_OPTIONS["dropout"], show_default=True,
              type=FiniteFloat(0, 1), help="Dropout" + _small("dropout") + ".")
@click.option("--max-positions", default=recipe.MODEL_OPTIONS["max_positions"], show_default=True,
              type=click.IntRange(min=2),
              help="Longest sequence (subwords + EOS) the model accepts.")
@click.option("--tie-embeddings/--no-tie-embeddings",
              default=recipe.MODEL_OPTIONS["tie_embeddings"], show_default=True,
              help="Share decoder input embedding and output projection.")
@click.option("--markov-order", default=recipe.MODEL_OPTIONS["markov_order"], show_default=True,
              type=click.IntRange(min=0),
              help="Markov decoder: self-attention sees only the previous k target tokens, "
                   "with their static embeddings as keys/values (0 = off).")
@model_option_option
@click.option("--base", "base_dir", type=click.Path(file_okay=False), default=None,
              help="alignment-layer: a trained transformer model directory to use as the "
                   "frozen base (skips stage 1; the model size comes from it).")
@click.option("--init-from", "init_dir", type=click.Path(file_okay=False), default=None,
              help="Fine-tune: start every direction from the best weights of this trained "
                   "model directory of the same --model (e.g. on new data, or with a "
                   "--guide); its BPE, vocabularies and model size are used, the "
                   "preprocessing and model-size flags are not.")
@click.option("--layer-keys", type=click.Choice(["word", "enc", "add"]), default=None,
              help="alignment-layer: keys/values of the layer: source word embeddings, encoder "
                   "output, or their average  [default: add]")
@click.option("--layer-query", type=click.Choice(["prefix", "target"]), default=None,
              help="alignment-layer: what the layer's queries see: the base decoder state "
                   "(the unguided layer of Zenkel et al. 2019), or also the known target word "
                   "and the whole target sentence (the guided layer of 2020: its attention "
                   "learns --guide's links, or without --guide the recipe's links of the "
                   "bitext, trained first into MODEL_DIR/guide)  [default: target]")
# training
@max_tokens_option
@click.option("--update-freq", default=TrainConfig.update_freq, show_default=True,
              type=click.IntRange(min=1),
              help="Batches per update (gradient accumulation).")
@lr_option
@warmup_option
@click.option("--lr-schedule", type=click.Choice(C.LR_SCHEDULES), default=None,
              help="Decay after the warm-up: inverse square root, or linear to lr/(T-w+1) at "
                   "the run's last update T (--max-updates or --max-epochs, whichever limit "
                   "comes first; --resume then needs the same limits).  [default: "
                   f"{recipe.TRAINING['lr_schedule']}; the guided alignment layer's own "
                   f"stage: {recipe.LAYER_LR_SCHEDULE}]")
@click.option("--label-smoothing", default=recipe.TRAINING["label_smoothing"], show_default=True,
              type=FiniteFloat(0, 1))
@click.option("--clip-norm", default=recipe.TRAINING["clip_norm"], show_default=True,
              type=FiniteFloat(min=0),
              help="Gradient norm clipping (0 = off).")
@max_updates_option
@max_epochs_option(None, default_help=f"{recipe.EPOCHS_PER_ROUND} with self-training rounds "
                                      f"(no limit with --max-updates, as align run), "
                                      f"{recipe.EPOCHS} with --rounds 1 (the guided alignment "
                                      f"layer: {recipe.EPOCHS} for its base, "
                                      f"{recipe.LAYER_EPOCHS} for the layer)")
@click.option("--checkpoint-interval", default=TrainConfig.checkpoint_interval,
              show_default=True, type=click.IntRange(min=1),
              help="Updates between checkpoints.")
@click.option("--valid-src", type=INPUT, help="Validation source sentences.")
@click.option("--valid-tgt", type=INPUT, help="Validation target sentences.")
@click.option("--valid-gold", type=INPUT,
              help="Gold alignments of the validation pairs: validation AER per checkpoint.")
@click.option("--valid-gold-format", type=click.Choice(["talp", "naacl"]), default="talp",
              show_default=True)
@click.option("--valid-method", default="", help="Extraction method for validation AER "
                                                 "(default: the model kind's first).")
@guide_options
@rounds_option(None, default_help=f"{recipe.ROUNDS} for hmm0 and hmm1 in both directions; 1 "
                                  f"for the other kinds")
@self_training_options
@agreement_weight_option
@join_lines_option
@device_option
@precision_option
@deterministic_option
@seed_option
@threads_option()
@click.option("--parallel-directions/--serial-directions", default=None,
              help="CPU: train fwd and rev at the same time, each in its own process with "
                   "half of --threads (the same weights as training them in turn with that "
                   "many threads; faster where more threads help a model less than a second "
                   "process, see eval/results/parallel_directions.md), or one after the "
                   "other  [default: side by side on a CPU with 2+ cores and threads, from "
                   "1,000 training pairs on, unless --agreement-weight or torchrun]")
@resume_option
@click.option("--resume-ignore-data-change", "ignore_data_change", is_flag=True,
              help="With --resume: continue on the corpus cached in --model-dir even though "
                   "the training bitext given now differs from the one it was built from "
                   "(without this, --resume refuses; --overwrite trains on the new data).")
@overwrite_option
@quiet_option
@click.option("-v", "--verbose", is_flag=True, help="Debug messages (a line per log interval).")
def command(source: Optional[str], target: Optional[str], joint: Optional[str], model_dir: str,
            model_kind: str, directions: str, tokenize: bool, src_lang: str, tgt_lang: str,
            lowercase: Optional[bool], bpe_merges: Optional[int], joint_bpe: bool,
            bpe_min_frequency: int, bpe_sample: int, max_len: Optional[int], max_ratio: float, d_model: int, heads: int,
            encoder_layers: int, decoder_layers: int, ff_dim: int, dropout: float,
            max_positions: int, tie_embeddings: bool, markov_order: int,
            model_option: Tuple[str, ...], base_dir: Optional[str], init_dir: Optional[str],
            layer_keys: Optional[str], layer_query: Optional[str],
            max_tokens: Optional[int], update_freq: int, lr: Optional[float],
            warmup: Optional[int], lr_schedule: Optional[str],
            label_smoothing: float,
            clip_norm: float, max_updates: int, max_epochs: int, checkpoint_interval: int,
            valid_src: Optional[str], valid_tgt: Optional[str], valid_gold: Optional[str],
            valid_gold_format: str, valid_method: str, guide: Optional[str],
            guide_weight: Optional[float], rounds: Optional[int], self_guide_weight: float,
            self_guide_threshold: float,
            self_guide_mix_weight: float, fine_tune: bool, fine_tune_epochs: int,
            fine_tune_lr_schedule: str, round_pairs: int,
            fine_tune_share: float, final_agreement_weight: Optional[float], teacher: bool,
            agreement_weight: float, join_lines: Optional[int],
            device: str,
            precision: str, deterministic: bool, seed: int, threads: int,
            parallel_directions: Optional[bool], resume: bool, ignore_data_change: bool,
            overwrite: bool, quiet: bool, verbose: bool) -> None:
    """`align train` (its help: :data:`HELP`)."""
    from aligner.formats import open_bitext, read_bitext, read_gold
    from aligner.log import setup_logging
    from aligner.models import MODELS, model_class
    from aligner.training.builder import build_job
    from aligner.training.loop import use_deterministic_algorithms
    from aligner.training.recipe_guide import train_layer
    from aligner.training.rounds import train_rounds

    use_deterministic_algorithms(deterministic)   # before anything starts CUDA
    set_threads(threads)
    model_class(model_kind)  # one-line error for an unknown kind
    direction_list = parse_directions(directions)
    check_bitext_args(source, target, joint, "the training bitext")
    check_condition((valid_src is None) == (valid_tgt is None),
                    "give both --valid-src and --valid-tgt")
    check_condition(valid_gold is None or valid_src is not None,
                    "--valid-gold needs --valid-src and --valid-tgt")
    check_condition(resume or not ignore_data_change,
                    "--resume-ignore-data-change applies to --resume only")
    architecture = dict(d_model=("d_model", d_model), n_heads=("heads", heads),
                        enc_layers=("encoder_layers", encoder_layers),
                        dec_layers=("decoder_layers", decoder_layers), d_ff=("ff_dim", ff_dim),
                        dropout=("dropout", dropout),
                        max_positions=("max_positions", max_positions),
                        tie_embeddings=("tie_embeddings", tie_embeddings),
                        markov_order=("markov_order", markov_order))
    # a network's settings given (refused for a kind without them, e.g. --d-model for
    # --model classical); the builder fills the others with the recipe's, which on a small
    # bitext are not the flags' defaults (recipe.SMALL_MODEL_OPTIONS)
    context = click.get_current_context()
    model_options: Dict[str, Any] = {
        name: value for name, (parameter, value) in architecture.items()
        if context.get_parameter_source(parameter) is not click.core.ParameterSource.DEFAULT}
    model_options.update(parse_key_values(model_option, "--model-option"))
    layer_kinds = [name for name, cls in MODELS.items()
                   if "layer_keys" in cls.config_class.__dataclass_fields__]
    for flag, name, value in (("--layer-keys", "layer_keys", layer_keys),
                              ("--layer-query", "layer_query", layer_query)):
        if value is not None:
            check_condition(model_kind in layer_kinds,
                            f"{flag} applies to --model {', '.join(layer_kinds)} only")
            model_options[name] = value
    bitext = open_bitext(source, target, joint)  # checked now, read again at every pass
    valid_bitext = read_bitext(valid_src, valid_tgt) if valid_src is not None else None
    gold = None
    if valid_gold is not None:
        gold = read_gold(valid_gold, valid_gold_format, n_sentences=len(valid_bitext))
        check_condition(len(gold) == len(valid_bitext),
                        f"{valid_gold}: {len(gold)} alignments for {len(valid_bitext)} "
                        f"validation pairs")
        check_gold_in_range(gold, valid_gold, valid_gold_format, valid_bitext)
    request, plan = build_job(
        model_dir, bitext, model_kind=model_kind, directions=direction_list,
        model_options=model_options,
        prep_options=dict(tokenize=tokenize, src_lang=src_lang, tgt_lang=tgt_lang,
                          lowercase=lowercase, joint_bpe=joint_bpe,
                          bpe_min_frequency=bpe_min_frequency,
                          bpe_sample_sentences=bpe_sample),
        bpe_merges=bpe_merges, max_len=max_len, max_ratio=max_ratio, guide=guide,
        guide_weight=guide_weight, max_tokens=max_tokens, lr=lr, warmup=warmup,
        lr_schedule=lr_schedule, max_epochs=max_epochs, max_updates=max_updates,
        training=dict(update_freq=update_freq, label_smoothing=label_smoothing,
                      clip_norm=clip_norm, checkpoint_interval=checkpoint_interval,
                      valid_method=valid_method),
        agreement_weight=agreement_weight, rounds=rounds, join_lines=join_lines,
        self_training=dict(guide_weight=self_guide_weight,
                           guide_threshold=self_guide_threshold,
                           guide_mix_weight=self_guide_mix_weight, fine_tune=fine_tune,
                           fine_tune_epochs=fine_tune_epochs,
                           fine_tune_lr_schedule=fine_tune_lr_schedule,
                           round_pairs=round_pairs, fine_tune_share=fine_tune_share,
                           teacher=teacher),
        final_agreement_weight=final_agreement_weight,
        parallel_directions=parallel_directions, device=device, precision=precision,
        deterministic=deterministic, seed=seed, base_dir=base_dir, init_dir=init_dir,
        valid_bitext=valid_bitext, valid_gold=gold, resume=resume, overwrite=overwrite,
        quiet=quiet, verbose=verbose, argv=["align"] + sys.argv[1:],
        ignore_data_change=ignore_data_change)
    setup_logging(quiet=quiet, verbose=verbose)   # the messages between rounds
    try:
        if model_class(model_kind).BASE_KIND is not None:   # stages on a frozen base
            summaries = train_layer(request)
        else:                                               # rounds, or one training
            summaries = train_rounds(request, plan).summaries
    except KeyboardInterrupt:
        raise AlignerError(f"interrupted; continue with the same command plus --resume "
                           f"(last checkpoint in {model_dir})") from None
    rounds = plan.rounds
    if not quiet and summaries:   # (none: a finished run resumed)
        if agreement_weight > 0 or (rounds > 1 and plan.final_agreement_weight > 0):  # one pair
            summaries = {"fwd+rev": summaries[direction_list[0]]}
        for direction, summary in summaries.items():
            click.echo(f"align train: {direction}: {summary.updates} updates, "
                       f"{summary.epochs} epochs, {summary.tokens_per_s:.0f} target tokens/s, "
                       f"final train loss {summary.last_train_loss:.3f}"
                       + (f" (round {rounds} of {rounds})" if rounds > 1 else ""), err=True)
