"""Stand-in modules that let ``bfcl_eval``'s AST checker and prompt code import offline.

Every module in this package is a *stand-in*: it replaces a module that ``bfcl_eval`` imports at
module level but whose real implementation is either unavailable offline (not installed, because
``bfcl-eval`` is installed with ``--no-deps``) or drags in every model provider's SDK. None of them is
ever called on the AST path for Python categories; the ones that could be called raise a clear error.
:func:`sglang_pask.bfcl.offline.import_bfcl` decides which to install.
"""
