"""Extraction: a model directory's links of a bitext, what `align extract` and `align run`'s
alignments (the final one, each round's guide) do.

Its modules, one pipeline from a sentence pair to the written lines:

- ``inference``         sentence pairs in, word-level links (or soft matrices) out: the models'
                        extraction hooks, batches, a process per direction
- ``blocks``            a whole bitext cut into blocks: the unit of work, of resume (the parts
                        folder) and of torch.distributed's shards
- ``streaming``         pairs from a pipe or a terminal, in batches formed as they arrive
- ``corpus_alignment``  the one extraction path of a whole bitext: the Extraction, each block's
                        output lines, the block processes
- ``link_probs``        the probability of each link and the two text forms that carry it

The links of both directions are combined by aligner.links (no torch), which this package
uses and which never uses it.
"""
