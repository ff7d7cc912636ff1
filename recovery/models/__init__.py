from recovery.models.anomaly import Anomaly, Verdict
from recovery.models.api_token import ApiToken
from recovery.models.audit import AppendOnlyError, AuditEvent
from recovery.models.cluster import Cluster, Node, NodeLogCursor
from recovery.models.controller import ControllerToken
from recovery.models.detection_pattern import DetectionPattern
from recovery.models.environment_binding import EnvironmentBinding
from recovery.models.ingest_token import IngestToken, IngestTokenKind
from recovery.models.insights import ClusterGoodputSnapshot
from recovery.models.policy import Policy
from recovery.models.recommendation import Recommendation
from recovery.models.workflow import Workflow
from recovery.models.workload import Attempt, LogCursor, ProgressSample, Workload

__all__ = [
    "Anomaly",
    "ApiToken",
    "AppendOnlyError",
    "Attempt",
    "AuditEvent",
    "Cluster",
    "ClusterGoodputSnapshot",
    "ControllerToken",
    "DetectionPattern",
    "EnvironmentBinding",
    "IngestToken",
    "IngestTokenKind",
    "LogCursor",
    "Node",
    "NodeLogCursor",
    "Policy",
    "ProgressSample",
    "Recommendation",
    "Verdict",
    "Workflow",
    "Workload",
]
