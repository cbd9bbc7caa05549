"""The test suite (a package, so that tests/helpers imports as ``tests.helpers``: see tests/conftest.py)."""
