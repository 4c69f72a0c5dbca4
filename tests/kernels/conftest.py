"""Shared fixtures of the kernel tests."""
