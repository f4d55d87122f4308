"""Training: everything `align train` and `align run` do to make a model directory.

Its levels, each importing only those below it:

- ``request``       what a job is: TrainRequest (one model directory) and SelfTraining (rounds)
- ``run``           the training of one model directory: made ready, every direction trained
- ``rounds``        self-training rounds, each a model directory of its own (``run``)
- ``builder``       the one builder of jobs from the options of align train, align run, align demo
- ``recipe_guide``  the alignment layer's stages: the recipe's links (``builder``, ``rounds``),
                    its base, the layer (``run``)

and below them:

- ``recipe``      the recipe's values: what `align train` and `align run` train with no flags
- ``corpus``      the bitext tokenized and encoded into MODEL_DIR/corpus, and its fingerprint
- ``directions``  one direction's training, in this process or in a process of its own
- ``loop``        the training loop: batches, updates, checkpoints, validation, resume
- ``agreement``   both directions trained together with an agreement term
- ``guidance``    guide alignments: read, mapped to subwords, and their loss term
- ``samples``     which lines of the bitext each self-training round trains on
- ``teacher``     the classical aligner (IBM-1, then HMMs in agreement) whose links guide
                  round 1 of the recipe
- ``run_record``  MODEL_DIR/run.json: the sessions of a training job and its stages' seconds
"""
