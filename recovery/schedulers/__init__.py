"""Talking to schedulers safely: adapters by connection kind (``registry``), node lists,
identifiers, job opt-in. Pure Python, no Django: the Advisor Controller runs this on login nodes.
"""
