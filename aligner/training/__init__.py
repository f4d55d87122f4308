"""Training: everything `align train` and `align run` do to make a model directory.

- ``recipe``      the recipe's values: what `align train` and `align run` train with no flags
- ``run``         one training run: the request, the model directory made ready, every direction
- ``corpus``      the bitext tokenized and encoded into MODEL_DIR/corpus, and its fingerprint
- ``directions``  one direction's training, in this process or in a process of its own
- ``loop``        the training loop: batches, updates, checkpoints, validation, resume
- ``agreement``   both directions trained together with an agreement term
- ``guidance``    guide alignments: read, mapped to subwords, and their loss term
- ``rounds``      self-training rounds, each a model directory of its own
- ``samples``     which lines of the bitext each self-training round trains on
"""
