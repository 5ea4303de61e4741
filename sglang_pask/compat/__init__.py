"""Stand-ins for modules that cannot exist on a CPU-only machine.

Only :mod:`sglang_pask.compat.standins` lives here; it is imported at interpreter start by the
``sglang_pask_standins.pth`` file that ``scripts/install.sh`` writes into site-packages, so that
every SGLang process (the scheduler is spawned, not forked) sees the same import hooks.
"""
