"""Services on a cluster's settings, on the control plane's side (Django, models, the loop):
checking its scheduler and configuring its log and metric stores.

``recovery.sources`` talks to a site and knows nothing of the loop; what here needs both (a
store's answer scanned as the loop scans, a check saved on the cluster) lives here.
"""
