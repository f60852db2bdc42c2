"""Kueue's vocabulary for the fake Kueue: the keys it reads and writes, condition types, reasons.

Named as Kueue's Go constants name them, with their values (`pkg/controller/jobs/pod/constants`,
`pkg/controller/constants`, `apis/kueue/v1beta2`). No behaviour here.
"""

from __future__ import annotations

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
DEFAULT_NAMESPACE = "kueue-system"
DEFAULT_LOCAL_QUEUE_NAME = "default"  # ctrlconstants.DefaultLocalQueueName
DEFAULT_PRIORITY_CLASS_NAME = "default"  # ctrlconstants.DefaultWorkloadPriorityClassName
DEFAULT_POD_SET_NAME = "main"  # kueue.DefaultPodSetName (single pods)
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
MUTATING_WEBHOOK, VALIDATING_WEBHOOK = "mpod.kb.io", "vpod.kb.io"

# Pod labels and annotations.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_NAME_ANNOTATION = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
GROUP_FAST_ADMISSION_ANNOTATION = "kueue.x-k8s.io/pod-group-fast-admission"
GROUP_SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
WORKLOAD_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
ADMISSION_GATED_BY_ANNOTATION = "kueue.x-k8s.io/admission-gated-by"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
MANAGED_LABEL_VALUE = "true"
POD_FINALIZER = "kueue.x-k8s.io/managed"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
POD_INDEX_LABEL = "kueue.x-k8s.io/pod-group-pod-index"
POD_INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
PODSET_LABEL = "kueue.x-k8s.io/podset"
LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"

# On the Workload.
IS_GROUP_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/is-group-workload"
RESOURCE_IN_USE_FINALIZER = "kueue.x-k8s.io/resource-in-use"

# Workload condition types, and the pod condition TerminationTarget that Kueue sets on the pods it
# stops.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
WAITING_FOR_REPLACEMENT_PODS = "WaitingForReplacementPods"
FINISHED = "Finished"
TERMINATION_TARGET = "TerminationTarget"

# Reasons and fixed messages (Kueue v0.19.2's wording where its main branch differs).
PENDING = "Pending"
INADMISSIBLE = "Inadmissible"
NO_RESERVATION = "NoReservation"
IN_CLUSTER_QUEUE = "InClusterQueue"
DEACTIVATED = "Deactivated"
REACTIVATED = "Reactivated"
CLUSTER_QUEUE_STOPPED, LOCAL_QUEUE_STOPPED = "ClusterQueueStopped", "LocalQueueStopped"
CLUSTER_QUEUE_RESTARTED, LOCAL_QUEUE_RESTARTED = "ClusterQueueRestarted", "LocalQueueRestarted"
PODS_FAILED = "PodsFailed"
SUCCEEDED, FAILED, FAILED_TO_START = "Succeeded", "Failed", "FailedToStart"
WAIT_FOR_START, STARTED = "WaitForStart", "Started"
WAIT_FOR_RECOVERY, RECOVERED = "WaitForRecovery", "Recovered"
NOT_READY_MESSAGE = "Not all pods are ready or succeeded"
READY_MESSAGE = "All pods reached readiness and the workload is running"
RECOVERY_MESSAGE = "At least one pod has failed, waiting for recovery"
ADMITTED_MESSAGE = "The workload is admitted"
NO_RESERVATION_MESSAGE = "The workload has no reservation"
DEACTIVATED_MESSAGE = "The workload is deactivated"
REACTIVATED_MESSAGE = "The workload was reactivated"
PODS_FAILED_MESSAGE = "Some Failed pods need replacement"
NO_REPLACEMENT_MESSAGE = "No pods need replacement"
WORKLOAD_DELETED, WORKLOAD_DELETED_MESSAGE = "WorkloadDeleted", "Workload is deleted"
NOT_ADMITTED, NOT_ADMITTED_MESSAGE = "NotAdmitted", "Not admitted by cluster queue"
EVICTED_STOP_REASON = "WorkloadEvictedDueTo"  # + the Evicted reason
REQUEUE_ON = frozenset({"Preempted", "NodeFailures"})  # Requeued=True after these evictions
