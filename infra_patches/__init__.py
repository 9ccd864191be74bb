"""The built-in library of verified code patches for the reference workload (``workloads/gpt``).

Each patch is a folder holding ``patch.diff`` (a unified diff, paths relative to the
workload folder) and ``meta.toml`` (what it claims and when it applies; see
``infrarsi.patches.patch``). The folders are package data, not code: ``infrarsi.patches.patch``
finds them through ``importlib.resources``, so a wheel installed into site-packages
carries them as well as a checkout does.
"""
