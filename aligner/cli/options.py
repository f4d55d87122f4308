"""The options that commands share, each declared once: the training options of `align
train`, `align run` and `align demo`, and the inference options of `align extract`, `align show`
and `align translate` (--checkpoint, --device, --precision, --threads, -q; the last three also
the training commands', with one help text).

Each function here is a click decorator (one option, or a group of options) that every command
taking the option applies, so that the same option has the same name, type and help text in
every command (tests/test_cli_options.py compares the --help of all commands). Where commands
differ in the default (align run trains the recipe of aligner/training/recipe.py; align demo a small
model), the decorator takes the default and, where click cannot print it, the words of the
"[default: ...]" note; the help text before that note stays the same.

Options that only one command has stay in that command's module.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import click

from aligner import constants as C
from aligner.training import recipe
from aligner.utils import AlignerError

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

INPUT = click.Path(dir_okay=False, exists=False)


class FiniteFloat(click.FloatRange):
    """A float option that refuses inf and nan (a learning rate or loss weight of inf trains
    to NaN weights), and, like click.FloatRange, values outside [min, max]."""

    name = "float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:
        """The range note of --help ("x>=0", "0<=x<=1"); none without bounds (click's own
        would print "x<=None")."""
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


def _with_default(text: str, default_help: Optional[str]) -> str:
    """`text` plus a "[default: ...]" note (for a default that click cannot print: None, which
    the command resolves)."""
    return text if default_help is None else f"{text}  [default: {default_help}]"


def _count(number: int, thing: str) -> str:
    """'1 epoch', '2 epochs'."""
    return f"{number} {thing}" + ("" if number == 1 else "s")


def recipe_summary(first_round: str = "", flags: bool = True, mixed: bool = True) -> str:
    """What the recipe (aligner/training/recipe.py) trains, in the words of the --help of the
    commands that train it, made from its values so that the help says what they do.
    first_round: round 1's length in other words than the recipe's epochs (align demo's);
    flags: name the options that turn the teacher off; mixed: say that the output mixes the
    teacher's posteriors in (not `align demo`'s table, which is the network's)."""
    if recipe.TEACHER:
        teacher = ("round 1 is guided by the links of a classical teacher (IBM-1, then HMMs "
                   "of both directions in agreement, trained by EM on the words of round 1's "
                   f"lines and more, up to {recipe.TEACHER_PAIRS:,} lines in all"
                   + ("; --no-teacher: unguided)" if flags else ")"))
    else:
        teacher = "round 1 trains unguided" + (" (--teacher: a classical teacher's links "
                                               "guide it)" if flags else "")
    start = ("fine-tunes the previous round's model" if recipe.FINE_TUNE_ROUNDS
             else "trains new weights")
    first = first_round or _count(recipe.EPOCHS_PER_ROUND, "epoch")
    length = (f"of {first} each" if first == _count(recipe.FINE_TUNE_EPOCHS, "epoch")
              else f"({first} in round 1, {_count(recipe.FINE_TUNE_EPOCHS, 'epoch')} in each "
                   f"round after it)")
    rounds = (f"in {recipe.ROUNDS} self-training rounds {length}: {teacher}; each round "
              f"after the first {start} guided by its own alignments of the bitext, with a "
              f"{recipe.FINE_TUNE_LR_SCHEDULE} learning-rate decay" if recipe.ROUNDS > 1
              else f"in one training of {first}")
    mixed = (f", each direction's mixed with the teacher's at weight {recipe.MIX_WEIGHT:g}, "
             f"growing to 1 on lines longer than the bitext's (align extract --mix-length; "
             f"--mix-weight 0: the network's alone), the teacher's share judged at "
             f"threshold {recipe.TEACHER_MIX_THRESHOLD:g}"
             if mixed and recipe.TEACHER and recipe.ROUNDS > 1 else "")
    return (f"{recipe.MODEL_KIND}, both directions, {rounds}; its output: {recipe.METHOD} "
            f"alignments{mixed}, combined by -H {recipe.HEURISTIC} at threshold "
            f"{recipe.THRESHOLD:g}")


def _apply(function, decorators):
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def bitext_options(function):
    """-s/-t or -i: a bitext (check the combination with
    :func:`aligner.cli.train.check_bitext_args`)."""
    return _apply(function, [
        click.option("-s", "--source", type=INPUT, help="Source sentences, one per line."),
        click.option("-t", "--target", type=INPUT, help="Target sentences, line-aligned."),
        click.option("-i", "--input", "joint", type=INPUT,
                     help="One 'source ||| target' file instead of -s/-t."),
    ])


def not_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """click callback of a path option that names an output (a file or a directory): an empty
    name ('') is one error line naming the option, not an OS error without a file name."""
    if value == "":
        raise AlignerError(f"{'/'.join(param.opts) or param.name}: empty directory name")
    return value


def model_dir_option(*short: str, required: bool, default_help: Optional[str] = None
                     ) -> Decorator:
    """--model-dir (align train: required, also -o; align run: a temporary directory unless
    given, hence `default_help`). An empty name is refused (:func:`not_empty`)."""
    return click.option(
        *short, "--model-dir", required=required, default=None, callback=not_empty,
        type=click.Path(file_okay=False),
        help=_with_default("The model directory (self-contained: config, BPE, vocabularies, "
                           "weights; align extract aligns new text with it).", default_help))


def bpe_merges_option(default: Optional[int] = None,
                      default_help: Optional[str] = "one per five training pairs, rounded to "
                                                    "thousands, 1,000 to 10,000") -> Decorator:
    """--bpe-merges: None = recipe.bpe_merges(number of pairs) (align train, align run);
    align demo gives a number."""
    return click.option(
        "--bpe-merges", default=default, show_default=default is not None,
        type=click.IntRange(min=0),
        help=_with_default("BPE merge operations (0 = whole words).",
                           default_help if default is None else None))


def lowercase_option() -> Decorator:
    """--lowercase/--no-lowercase: None = the kind's (recipe.CLASSICAL_LOWERCASE for the
    classical aligner, recipe.NETWORK_LOWERCASE for a neural kind with self-training rounds,
    off for one round; aligner/training/builder.py)."""
    return click.option(
        "--lowercase/--no-lowercase", default=None,
        help="Lowercase both sides' words (the output's word positions are the input's).  "
             f"[default: {'on' if recipe.CLASSICAL_LOWERCASE else 'off'} for --model "
             f"classical, {'on' if recipe.NETWORK_LOWERCASE else 'off'} for a neural model "
             "with self-training rounds (align run), off for one round]")


#: the kinds `align run` trains (`align train` takes every kind of aligner.models.MODELS,
#: named here without importing torch: tests/test_model_contract.py checks the list)
RUN_KINDS = (recipe.MODEL_KIND, "classical")
KNOWN_KINDS = "transformer, hmm0, hmm1, alignment-layer, classical"


def model_kind_option(choices: Optional[tuple] = None) -> Decorator:
    """--model of align train (any kind; checked against the registry when used) and align
    run (`choices`: the recipe's kind or the classical aligner), with one help text."""
    return click.option(
        "--model", "model_kind", default=recipe.MODEL_KIND, show_default=True,
        type=click.Choice(list(choices)) if choices else str,
        help=f"Model kind: {recipe.MODEL_KIND}, the recipe's neural direct HMM (the best "
             f"alignments); classical, IBM Model 1 then word HMMs of both directions in "
             f"agreement, the recipe's teacher alone (no network, no BPE, one training: a "
             f"quick first look, or a corpus too large for the recipe); align train takes "
             f"any of {KNOWN_KINDS}.")


def model_option_option(function):
    """-M/--model-option KEY=VALUE (aligner.cli.train.parse_key_values)."""
    return click.option(
        "-M", "--model-option", "model_option", multiple=True, metavar="KEY=VALUE",
        help="A setting of the model kind by name (repeatable; it wins over the other model "
             "flags and over the recipe), e.g. -M chunk_size=8 or -M d_model=64.")(function)


#: the "[default: ...]" words of the options whose default depends on the device
#: (recipe.device_defaults, resolved by
#: :func:`aligner.training.builder.device_defaults`)
_CPU, _GPU = recipe.device_defaults("cpu"), recipe.device_defaults("cuda")


def _by_device(key: str, form: str) -> str:
    """The default of setting `key` on each device, written with `form`."""
    cpu, gpu = form.format(_CPU[key]), form.format(_GPU[key])
    where = (f"{cpu} on the CPU and a CUDA GPU" if cpu == gpu
             else f"{cpu} on the CPU, {gpu} on a CUDA GPU")
    return where + "; with --resume the run's"


def max_tokens_option(function):
    """--max-tokens of training batches (aligner.config.TrainConfig.max_tokens); None:
    :func:`~aligner.training.builder.device_defaults`."""
    return click.option(
        "--max-tokens", default=None, type=click.IntRange(min=1),
        help=_with_default("Padded tokens per training batch (max(source, target) length x "
                           "sentences).",
                           _by_device("max_tokens", "{:,}")))(function)


def lr_option(function):
    """--lr, the peak learning rate (aligner.config.TrainConfig.lr); None:
    :func:`~aligner.training.builder.device_defaults`."""
    return click.option(
        "--lr", default=None, type=FiniteFloat(min=0),
        help=_with_default("Peak learning rate.",
                           _by_device("lr", "{:g}"))
    )(function)


def warmup_option(function):
    """--warmup, linear warm-up updates (aligner.config.TrainConfig.warmup); None: the device's
    (:func:`~aligner.training.builder.device_defaults`), or TRAINING's with a
    --max-tokens of the user's."""
    return click.option(
        "--warmup", default=None, type=click.IntRange(min=0),
        help=_with_default("Linear warm-up updates (then --lr-schedule).",
                           _by_device("warmup", "{}")))(function)


def max_updates_option(function):
    """--max-updates (aligner.config.TrainConfig.max_updates)."""
    return click.option(
        "--max-updates", default=0, show_default=True, type=click.IntRange(min=0),
        help="Stop after this many updates per direction (0 = no limit: the epochs decide); "
             "with self-training rounds, the length of every round.")(function)


def max_epochs_option(default: Optional[int], min_epochs: int = 0,
                      default_help: Optional[str] = None) -> Decorator:
    """--max-epochs of align train (None: resolved from --rounds and --max-updates) and align
    demo (a number, at least 1: the demo has no other limit).

    align run's --epochs stays an option of its own: it is the length of a round that
    --max-updates replaces (align run trains `0 if max_updates else epochs` epochs), where
    --max-epochs is a limit beside --max-updates (whichever comes first).
    """
    return click.option(
        "--max-epochs", default=default, show_default=default is not None,
        type=click.IntRange(min=min_epochs),
        help=_with_default("Stop after this many epochs per direction (0 = no limit); with "
                           "self-training rounds, round 1's (a fine-tuned round trains "
                           "--fine-tune-epochs), or every round's with --max-updates.",
                           default_help if default is None else None))


def guide_options(function):
    """--guide and --guide-weight: guided training of round 1 (aligner/training/guidance.py)."""
    return _apply(function, [
        click.option("--guide", type=INPUT, default=None,
                     help="Guided alignment training (hmm0, hmm1, alignment-layer): Pharaoh "
                          "word alignments of "
                          "the training bitext, one line per training line, source-target "
                          "(e.g. eflomal's grow-diag, or from fast_align, GIZA++ or align "
                          "extract), indexing the words as training sees them (after "
                          "--tokenize). Adds --guide-weight x the cross-entropy between the "
                          "guide (uniform over each target subword's linked source subwords) "
                          "and the model's posterior alignment distribution (eval/results/"
                          "guided_enfr.md: the recipe's quality in a third of the updates; "
                          "for alignment-layer the layer's attention, --layer-query target; "
                          "without --guide that layer learns the recipe's links of the "
                          "bitext, trained first into MODEL_DIR/guide)."),
        click.option("--guide-weight", default=None, type=FiniteFloat(min=0),
                     help=f"Weight of the guide's cross-entropy term (with --guide, or the "
                          f"alignment layer's recipe guide).  "
                          f"[default: {recipe.GUIDE_WEIGHT:g}; {recipe.LAYER_GUIDE_WEIGHT:g} "
                          f"for alignment-layer]"),
    ])


def rounds_option(default: Optional[int], default_help: Optional[str] = None) -> Decorator:
    """--rounds of self-training: align run's is recipe.ROUNDS, align train's None (resolved
    from the model kind and directions: aligner.training.rounds.default_rounds)."""
    return click.option(
        "--rounds", default=default, show_default=default is not None,
        type=click.IntRange(min=1),
        help=_with_default(f"Self-training (hmm0, hmm1, both directions): after each round "
                           f"but the last, the round's own alignments of the training bitext "
                           f"(-H {recipe.HEURISTIC}; align run: its -H) guide the next round, "
                           f"which fine-tunes the round's model (round 1 takes --guide, if "
                           f"given; 1 = one plain training).",
                           default_help if default is None else None))


def self_training_options(function):
    """The options of self-training rounds after the first (aligner.training.rounds.SelfTraining;
    `align train` and `align run`)."""
    return _apply(function, [
        click.option("--self-guide-weight", default=recipe.SELF_GUIDE_WEIGHT,
                     show_default=True, type=FiniteFloat(min=0),
                     help="Weight of the guide term in a self-training round (the previous "
                          "round's alignments as guide; --guide-weight is --guide's, in "
                          "round 1)."),
        click.option("--self-guide-threshold", type=FiniteFloat(0.0, 1.0, max_open=True),
                     default=recipe.SELF_GUIDE_THRESHOLD, show_default=True,
                     help="Threshold of -H soft-average for the alignments that guide the "
                          "next self-training round."),
        click.option("--self-guide-mix-weight", type=FiniteFloat(0.0, 1.0),
                     default=recipe.SELF_GUIDE_MIX_WEIGHT, show_default=True,
                     help="Self-training with a teacher: the alignments that guide the next "
                          "round mix the teacher's posteriors into the round's at this weight, "
                          "as the output does (--mix-weight; 0 = the round's alone)."),
        click.option("--teacher/--no-teacher", default=recipe.TEACHER, show_default=True,
                     help="Self-training: round 1 is guided by the links of a classical "
                          "aligner trained by EM on the words of its lines and more, up to "
                          f"{recipe.TEACHER_PAIRS:,} lines in all (IBM-1, then HMMs "
                          "of both directions in agreement; aligner/training/teacher.py), unless "
                          "--guide is given; the output mixes its posteriors in; --no-teacher: "
                          "round 1 trains unguided."),
        click.option("--fine-tune/--afresh", "fine_tune", default=recipe.FINE_TUNE_ROUNDS,
                     show_default=True,
                     help="Self-training: each round after the first starts from the "
                          "previous round's model (as align train --init-from), or from new "
                          "weights."),
        click.option("--fine-tune-epochs", default=recipe.FINE_TUNE_EPOCHS, show_default=True,
                     type=click.IntRange(min=1),
                     help="Passes over the bitext per direction in a fine-tuned self-training "
                          "round (a run limited by --max-updates: each round as round 1)."),
        click.option("--round-pairs", default=recipe.ROUND_PAIRS, show_default=True,
                     type=click.IntRange(min=0),
                     help="Self-training: each round trains on this many lines of the "
                          "bitext, a sample drawn anew per round (round 1's with --seed), and "
                          "only they are aligned to guide it: a round costs the same on any "
                          "larger corpus (0 = every round trains on the whole bitext, as it "
                          "does when the bitext has no more lines)."),
        click.option("--fine-tune-share", default=recipe.FINE_TUNE_SHARE, show_default=True,
                     type=FiniteFloat(0.0, 1.0, min_open=True),
                     help="Self-training: each round after the first trains on this share of "
                          "the bitext (at most --round-pairs lines), a sample drawn as "
                          "--round-pairs's (1 = as many lines as round 1)."),
        click.option("--final-agreement-weight", default=None, type=FiniteFloat(min=0),
                     help="Self-training: the last of two or more rounds trains fwd and rev "
                          "together in one process, with this --agreement-weight (0 = each "
                          "direction on its own, as in the other rounds).  [default: "
                          f"{recipe.FINAL_AGREEMENT_WEIGHT:g} with two or more rounds]"),
        click.option("--fine-tune-lr-schedule", type=click.Choice(C.LR_SCHEDULES),
                     default=recipe.FINE_TUNE_LR_SCHEDULE, show_default=True,
                     help="Learning-rate decay of a fine-tuned self-training round (round 1 "
                          f"and --afresh rounds keep round 1's: align train --lr-schedule, "
                          f"align run the recipe's {recipe.TRAINING['lr_schedule']})."),
    ])


def agreement_weight_option(function):
    """--agreement-weight (aligner/training/agreement.py)."""
    return click.option(
        "--agreement-weight", default=recipe.AGREEMENT_WEIGHT, show_default=True,
        type=FiniteFloat(min=0),
        help="Agreement training (hmm0, hmm1): train fwd and rev together on the same "
             "batches, adding this weight x the squared difference of their alignment "
             "posteriors over each pair's subwords (0 = each direction on its own).")(function)


def join_lines_option(function):
    """--join-lines (aligner/training/joined_text.py)."""
    return click.option(
        "--join-lines", default=None, show_default=f"{recipe.JOIN_LINES} with self-training "
        f"rounds and no --guide, else 1", type=click.IntRange(min=1),
        help=f"The teacher, the rounds and their guides train on the bitext's lines joined "
             f"end to end in runs of 1 to this many consecutive lines (drawn per run, at most "
             f"{recipe.JOIN_WORDS} words a side), so that the model also learns lines longer "
             f"than the bitext's usual ones; the output aligns every line as given (1 = the "
             f"lines as they are).")(function)


def shortlist_option(function):
    """--shortlist of the final alignment (align run) and of the alignment calibrated."""
    return click.option(
        "--shortlist", default=recipe.SHORTLIST, show_default=True, type=click.IntRange(min=0),
        help="Normalize the final alignment's lexicon over this many most frequent words and "
             "each sentence's own instead of the vocabulary: faster, approximate (0 = exact; "
             "the guides of the self-training rounds are exact; align extract: -O "
             "shortlist=N; eval/results/profile_extract.md).")(function)


_SUBWORD_POOLING_HELP = (
    "How the soft matrices (soft-average, --soft, --link-probs, the calibration) combine a "
    "word's subwords: 'max' gives a word pair the highest of the word's subwords' "
    "probabilities, 'mean' their average (a word whose two subwords align to two words then "
    "gets half a link to each; eval/results/subword_pooling.md).")


def subword_pooling_option(function):
    """--subword-pooling of the soft matrices measured or written: align run, calibrate."""
    return click.option(
        "--subword-pooling", type=click.Choice(C.SUBWORD_POOLINGS),
        default=recipe.SUBWORD_POOLING, show_default=True,
        help=_SUBWORD_POOLING_HELP)(function)


def extract_subword_pooling_option(function):
    """--subword-pooling of align extract: by default the model directory's calibration's."""
    return click.option(
        "--subword-pooling", type=click.Choice(C.SUBWORD_POOLINGS), default=None,
        help=_SUBWORD_POOLING_HELP + f"  [default: the one MODEL_DIR/calibration.json was "
             f"measured with (align run's: {recipe.SUBWORD_POOLING}; a record that names none: "
             f"mean), else {recipe.SUBWORD_POOLING}]")(function)


def resume_option(function):
    """--resume of a run in --model-dir (aligner.config.RESUMABLE_CHANGES: what may change)."""
    return click.option(
        "--resume", is_flag=True,
        help="Continue the interrupted run in --model-dir (same data and settings, -H and "
             "--threshold included; only the limits --max-updates and --max-epochs or "
             "--epochs, --checkpoint-interval, --device, --precision and --deterministic "
             "may change, and the output files): a self-training run "
             "goes on in the round it stopped in, and a finished one given more --rounds "
             "trains them; align run then aligns the bitext, from the first unfinished block "
             "of an alignment cut off.")(function)


def overwrite_option(function):
    """--overwrite: replace the run in a non-empty --model-dir (aligner.model_dir)."""
    return click.option("--overwrite", is_flag=True,
                        help="Replace the run in a non-empty --model-dir.")(function)


def block_lines_option(function):
    """--block-lines: lines per block of a whole-bitext alignment (aligner/extract/blocks.py)."""
    return click.option(
        "--block-lines", type=click.IntRange(min=1), default=None,
        help="Lines per block of the alignment of the bitext: what is in memory at a time, "
             "what --resume goes on from after a cut-off run and, for align extract under "
             "torchrun, what one process aligns  [default: 10000]")(function)


def processes_option(function):
    """--processes of a whole-bitext alignment on a CPU
    (aligner.extract.corpus_alignment.block_processes)."""
    return click.option(
        "--processes", type=click.IntRange(min=0), default=0, show_default=True,
        help="Processes that align the blocks of the bitext on a CPU, each with its share of "
             "the threads (0 = one per core, no more than --threads, nor than the available "
             "memory holds at about 1 GB each; at most one per block; the same output with "
             "any number).")(function)


def device_option(function):
    """--device of every command that runs a model (aligner.distributed.resolve_device)."""
    return click.option(
        "--device", default="auto", show_default=True,
        help="auto (CUDA if available, else CPU), cpu, cuda, cuda:N (under torchrun: local "
             "rank r on GPU N+r).")(function)


def checkpoint_option(function):
    """--checkpoint of the commands that load a model directory (extract, show, translate:
    aligner.model_dir.LoadedModelDir.load)."""
    return click.option(
        "--checkpoint", type=click.Choice(["best", "last"]), default="best", show_default=True,
        help="Which saved weights to use.")(function)


def inference_precision_option(function):
    """``--precision`` of inference (`align extract`, `align translate`: aligner/precision.py);
    the training commands' is :func:`precision_option`."""
    return click.option(
        "--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto",
        show_default=True,
        help="bf16: bfloat16 autocast (softmaxes, HMM sums and scores stay float32); auto = "
             "bf16 on CUDA GPUs with native bf16 (A100, H100, ...) and, for alignment, on CPUs "
             "with bf16 instructions (avx512_bf16, AMX), fp32 otherwise.")(function)


def precision_option(function):
    """``--precision`` of training (`align train`, `align run`: aligner/precision.py)."""
    return click.option(
        "--precision", type=click.Choice(C.PRECISIONS), default="auto", show_default=True,
        help="Training arithmetic: bf16 = bfloat16 autocast of the forward pass (weights and "
             "optimizer stay float32), fp32; auto = bf16 on a CUDA GPU with native bfloat16 "
             "(compute capability 8+), fp32 elsewhere (CPU, V100, T4). align run's final "
             "alignment: the same, but auto is also bf16 on a CPU with bf16 instructions "
             "(avx512_bf16, AMX), as align extract's.")(function)


def deterministic_option(function):
    """--deterministic of training (aligner.training.loop.use_deterministic_algorithms)."""
    return click.option(
        "--deterministic", is_flag=True,
        help="Deterministic GPU kernels (torch.use_deterministic_algorithms, "
             "CUBLAS_WORKSPACE_CONFIG=:4096:8): a CUDA run and its --resume twin give the same "
             "weights bit for bit, somewhat slower. The CPU is deterministic without it (the "
             "same output either way).")(function)


def seed_option(function):
    """--seed of training (aligner.config.TrainConfig.seed)."""
    return click.option("--seed", default=C.DEFAULT_SEED, show_default=True,
                        type=int)(function)


def threads_option(default: int = 0) -> Decorator:
    """--threads (aligner.cli.train.set_threads): 0 but for align demo, which takes 1 (its
    small model is no faster with more threads on a busy machine)."""
    return click.option(
        "--threads", default=default, show_default=True, type=click.IntRange(min=0),
        help="CPU threads for torch (0 = torch's default, usually all cores); two directions "
             "trained or aligned side by side get half each, at least 1.")


def quiet_option(function):
    """-q/--quiet (aligner.log.setup_logging) of every command that logs."""
    return click.option(
        "-q", "--quiet", is_flag=True,
        help="Warnings only, no progress bars or messages (align run and align demo still "
             "print their results).")(function)
