"""Connectors to a site's own signal stacks: log stores (``logs``) and metric
stores (``metrics``).

Each connector turns an outside service's answers into the plain records the detectors read; the
services themselves stay the site's (nothing here writes to them).
"""
