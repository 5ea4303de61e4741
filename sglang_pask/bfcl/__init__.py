"""BFCL (Berkeley Function-Calling Leaderboard) accuracy harness, offline.

Pure Python; never imports sglang. The modules each do one job:

- :mod:`.data`: load questions and possible answers of the eight AST categories from the installed
  ``bfcl_eval`` package data.
- :mod:`.prompt`: BFCL's prompting format (function docs in the system prompt) as chat messages.
- :mod:`.grammar`: a regex (xgrammar dialect) that constrains an answer to a Python call list over the
  item's functions and their parameter names.
- :mod:`.strict_grammar`: the same answer with the function docs enforced as strict tools (declared
  order, required arguments, value types, enums).
- :mod:`.constraints`: those grammars by name (``--grammar`` of the bench and the calibration).
- :mod:`.checker`: BFCL's own AST checker on a model output.
- :mod:`.oracle`: a reference answer built from the possible-answer file (self-checks and tests).
- :mod:`.split`: the fixed calibration / evaluation split (``calibration_ids.txt``).
- :mod:`.offline`: makes ``bfcl_eval``'s prompt and checker modules importable without its ~90
  declared dependencies (see :mod:`.standins`).
"""
