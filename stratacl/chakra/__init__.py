"""Chakra execution traces (MLCommons): import into a harness trace, export from one."""
