"""Tests of the Python SDK under plain CPython.

componentize-py generates `wit_world` (the bindings) and
`componentize_py_types` at build time; here `fakes` stands in for both, with
an in-memory store, a scripted endpoint and a recording log.
"""
