"""The defaults of every command are the measured best recipe (aligner/training/recipe.py).

Changing a default is a deliberate commit: this test names each one.
"""
from __future__ import annotations

from aligner.training import recipe
from aligner.cli import calibrate, demo, extract, run, train
from aligner.models import model_class


def _defaults(command):
    return {parameter.name: parameter.default for parameter in command.params}


def test_train_defaults_are_the_recipe():
    defaults = _defaults(train.command)
    options = recipe.MODEL_OPTIONS
    assert defaults["model_kind"] == recipe.MODEL_KIND == "hmm1"
    assert (defaults["d_model"], defaults["heads"], defaults["encoder_layers"],
            defaults["decoder_layers"], defaults["ff_dim"], defaults["dropout"],
            defaults["max_positions"], defaults["tie_embeddings"], defaults["markov_order"]) == \
        (options["d_model"], options["n_heads"], options["enc_layers"], options["dec_layers"],
         options["d_ff"], options["dropout"], options["max_positions"],
         options["tie_embeddings"], options["markov_order"])
    # max_tokens, lr, warmup: None, resolved by the device (recipe.device_defaults: on the CPU
    # the recipe's; tests/test_gpu_settings.py)
    by_device = ("max_tokens", "lr", "warmup")
    # lr_schedule: None, TRAINING's, or recipe.LAYER_LR_SCHEDULE in the guided layer's own
    # stage (tests/test_recipe_guide.py)
    resolved = by_device + ("lr_schedule",)
    assert {key: defaults[key] for key in recipe.TRAINING if key not in resolved} == \
        {key: value for key, value in recipe.TRAINING.items() if key not in resolved}
    assert all(defaults[key] is None for key in resolved)
    assert {key: recipe.device_defaults("cpu")[key] for key in by_device} == \
        {key: recipe.TRAINING[key] for key in by_device}
    # None: recipe.EPOCHS_PER_ROUND a round with self-training rounds, recipe.EPOCHS with
    # --rounds 1; rounds: recipe.ROUNDS for the HMMs in both directions
    # (tests/test_self_training.py)
    assert defaults["max_epochs"] is None and defaults["max_updates"] == 0
    assert defaults["rounds"] is None
    assert (defaults["self_guide_weight"], defaults["self_guide_threshold"],
            defaults["fine_tune"], defaults["fine_tune_epochs"],
            defaults["fine_tune_lr_schedule"]) == \
        (recipe.SELF_GUIDE_WEIGHT, recipe.SELF_GUIDE_THRESHOLD, recipe.FINE_TUNE_ROUNDS,
         recipe.FINE_TUNE_EPOCHS, recipe.FINE_TUNE_LR_SCHEDULE)
    assert defaults["bpe_merges"] is None          # recipe.bpe_merges(number of pairs)
    assert defaults["agreement_weight"] == recipe.AGREEMENT_WEIGHT
    assert defaults["directions"] == "fwd,rev"
    # None: recipe.TRAIN_MAX_LEN for the recipe's kind, DataConfig's for the others
    # (tests/test_cli_train_extract.py)
    assert defaults["max_len"] is None


def test_extract_defaults_are_the_kinds_best():
    defaults = _defaults(extract.command)
    assert defaults["method"] is None and defaults["heuristic"] is None
    assert defaults["direction"] == "both"
    kind = model_class(recipe.MODEL_KIND)
    assert kind.METHODS[0] == recipe.METHOD          # the method extract takes by default
    assert kind.BEST_HEURISTIC == recipe.HEURISTIC   # the -H extract takes by default
    # None: the model directory's calibration's, else the recipe's (tests/test_calibration.py)
    assert defaults["subword_pooling"] is None
    assert _defaults(calibrate.command)["subword_pooling"] == recipe.SUBWORD_POOLING


def test_run_defaults_are_the_recipe():
    defaults = _defaults(run.command)
    assert defaults["heuristic"] == recipe.HEURISTIC
    # None: recipe.THRESHOLD after self-training rounds, 0.5 with --rounds 1 (tests/test_run.py)
    assert defaults["threshold"] is None
    assert defaults["self_guide_threshold"] == recipe.SELF_GUIDE_THRESHOLD
    assert defaults["fine_tune_epochs"] == recipe.FINE_TUNE_EPOCHS
    assert defaults["self_guide_weight"] == recipe.SELF_GUIDE_WEIGHT
    assert defaults["epochs"] == recipe.EPOCHS_PER_ROUND and defaults["max_updates"] == 0
    # None: recipe.device_defaults (the CPU's: recipe.TRAINING's)
    assert defaults["max_tokens"] is None and defaults["lr"] is None
    assert recipe.device_defaults("cpu")["max_tokens"] == recipe.TRAINING["max_tokens"]
    assert defaults["agreement_weight"] == recipe.AGREEMENT_WEIGHT
    assert defaults["rounds"] == recipe.ROUNDS and defaults["shortlist"] == recipe.SHORTLIST
    assert defaults["subword_pooling"] == recipe.SUBWORD_POOLING
    # None: recipe.TRAIN_MAX_LEN, within -M max_positions (tests/test_run.py)
    assert defaults["max_len"] is None


def test_demo_defaults():
    defaults = _defaults(demo.command)
    assert (defaults["max_epochs"], defaults["bpe_merges"]) == (recipe.DEMO_EPOCHS,
                                                                 recipe.DEMO_BPE_MERGES)
    # the demo's deviations from the recipe: model size, batches and learning rate only
    assert set(recipe.DEMO_MODEL_OPTIONS) < set(recipe.MODEL_OPTIONS)
    assert all(recipe.DEMO_MODEL_OPTIONS[key] != recipe.MODEL_OPTIONS[key]
               for key in recipe.DEMO_MODEL_OPTIONS)
    assert set(recipe.DEMO_TRAINING) <= set(recipe.TRAINING)


def test_a_round_on_a_small_bitext_repeats_its_epochs():
    """build_job: ceil(ROUND_MIN_PAIRS / lines) times round 1's epochs and the fine-tuned
    rounds' (the round's lines: its sample where --round-pairs cuts one); once from
    ROUND_MIN_PAIRS lines on, for one round, with --max-updates, and for align demo's own."""
    from aligner.formats import Bitext
    from aligner.training.builder import build_job

    def job(n_lines, **given):
        bitext = Bitext([["a", "b"]] * n_lines, [["c"]] * n_lines, "s", "t")
        request, plan = build_job("m", bitext, device="cpu", **given)
        return request.train_config.max_epochs, plan.fine_tune_epochs

    assert [recipe.round_epoch_repeats(n) for n in (1, 999, 1000, 1237, 3000, 24999, 25000,
                                                    10 ** 6)] == [25, 25, 25, 21, 9, 2, 1, 1]
    assert job(1000) == (25, 25)
    assert job(25000) == (1, 1)
    assert job(1000, max_epochs=2, self_training=dict(fine_tune_epochs=3)) == (50, 75)
    assert job(100000, self_training=dict(round_pairs=5000)) == (5, 5)
    assert job(1000, rounds=1) == (recipe.EPOCHS, recipe.FINE_TUNE_EPOCHS)
    assert job(1000, max_updates=7)[0] == 0
    assert job(1000, epoch_repeats=1) == (1, 1)


def test_a_small_bitext_trains_the_recipes_smaller_network():
    """build_job: where the recipe's kind repeats each round's epochs SMALL_MODEL_REPEATS times
    or more (under 5,000 lines) it gets SMALL_MODEL_OPTIONS over MODEL_OPTIONS, else
    MODEL_OPTIONS (fewer repeats, one round, --max-updates, the demo's own epochs); settings
    given win, and the other kinds keep MODEL_OPTIONS. `align train` passes only the model
    flags given, so that its defaults do not undo the rule."""
    from aligner.formats import Bitext
    from aligner.training.builder import build_job

    def options(n_lines, **given):
        bitext = Bitext([["a", "b"]] * n_lines, [["c"]] * n_lines, "s", "t")
        return build_job("m", bitext, device="cpu", **given)[0].model_options

    small = recipe.SMALL_MODEL_OPTIONS
    recipes = {key: recipe.MODEL_OPTIONS[key] for key in small}
    assert set(small) < set(recipe.MODEL_OPTIONS)
    assert all(small[key] != recipe.MODEL_OPTIONS[key] for key in small)
    assert recipe.round_epoch_repeats(4999) == recipe.SMALL_MODEL_REPEATS
    assert recipe.round_epoch_repeats(5000) == recipe.SMALL_MODEL_REPEATS - 1
    below = options(4999)
    assert {key: below[key] for key in small} == small
    assert below["max_positions"] == recipe.MODEL_OPTIONS["max_positions"]
    for n_lines, given in ((5000, {}), (1000, dict(rounds=1)), (1000, dict(max_updates=5)),
                           (1000, dict(epoch_repeats=1))):
        found = options(n_lines, **given)
        assert {key: found[key] for key in small} == recipes, (n_lines, given)
    given = options(100, model_options=dict(d_model=96, dropout=0.0))
    assert (given["d_model"], given["dropout"], given["enc_layers"]) == (96, 0.0,
                                                                          small["enc_layers"])
    other = options(100, model_kind="hmm0")
    assert other["d_model"] == recipe.MODEL_OPTIONS["d_model"]


def test_the_classical_aligner_and_the_recipe_lowercase_and_one_neural_round_does_not():
    """build_job: lowercase None is recipe.CLASSICAL_LOWERCASE for --model classical,
    recipe.NETWORK_LOWERCASE for a neural kind with self-training rounds (the recipe), off for
    a neural kind in one round; a value given wins."""
    from aligner.formats import Bitext
    from aligner.training.builder import build_job

    def lowercase(kind, rounds=1, **given):
        bitext = Bitext([["A", "b"]] * 50, [["c"]] * 50, "s", "t")
        request = build_job("m", bitext, model_kind=kind, device="cpu",
                            prep_options=dict(given), rounds=rounds)[0]
        return request.prep_config.lowercase

    assert recipe.CLASSICAL_LOWERCASE is True and recipe.NETWORK_LOWERCASE is True
    assert lowercase("classical") is True and lowercase("classical", lowercase=None) is True
    assert lowercase("classical", lowercase=False) is False
    assert lowercase("hmm1") is False and lowercase("hmm1", lowercase=True) is True
    assert lowercase("hmm1", rounds=2) is True and lowercase("hmm0", rounds=2) is True
    assert lowercase("hmm1", rounds=2, lowercase=False) is False


def test_align_train_applies_the_small_bitext_rule(tmp_path):
    """`align train` on a 40-line bitext (two rounds, each epoch repeated 25 times): the
    config holds the small network, except a size flag given."""
    import json

    from cli_runner import run
    from synthetic import monotone_corpus, write_corpus

    sources, targets, _ = monotone_corpus(40, seed=3)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets)
    for name, flags in (("plain", []), ("given", ["--d-model", "48"])):
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / name, "--no-teacher",
            "--max-epochs", "1", "--fine-tune-epochs", "1", "--bpe-merges", "20",
            "--max-tokens", "400", *flags)
    plain = json.loads((tmp_path / "plain" / "config.json").read_text())["models"]["fwd"]
    given = json.loads((tmp_path / "given" / "config.json").read_text())["models"]["fwd"]
    assert {key: plain[key] for key in recipe.SMALL_MODEL_OPTIONS} == \
        recipe.SMALL_MODEL_OPTIONS
    assert given["d_model"] == 48 and given["dropout"] == recipe.SMALL_MODEL_OPTIONS["dropout"]
