"""Links and their files' arithmetic: combining two directions, scoring against gold, sweeping
a threshold, drawing. Never imports torch (only numpy; matplotlib when drawing), so `align
symmetrize` and `align score-aer` start instantly (tests/test_import_graph.py checks it).

- ``symmetrize``       the Moses heuristics of two directions' hard links (intersect, union,
                       grow-diag, grow-diag-final, grow-diag-final-and)
- ``soft_symmetrize``  soft-average: the two directions' soft alignments averaged, thresholded
- ``combine``          the one function that combines two directions by a heuristic's name
- ``metrics``          AER, precision, recall and F1 over per-sentence counts
- ``pr_curve``         a probability-threshold sweep against gold and its precision/recall curve
- ``plot``             heat maps of one pair's soft alignment matrices

The files themselves (Pharaoh links, gold, bitexts) are read and written by aligner.formats.
"""
