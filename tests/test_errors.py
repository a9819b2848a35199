"""The translations of posttrain_env/errors.py, without a server: what Temporal's client errors
mean for the gateway's answer (transient or permanent, read from the gRPC status and its
details, never from the message), and how failures become the errors agents see."""

from __future__ import annotations

import pytest
from google.protobuf.any_pb2 import Any as AnyProto
from temporalio.api.common.v1 import GrpcStatus
from temporalio.api.enums.v1 import ResourceExhaustedCause
from temporalio.api.errordetails.v1 import NotFoundFailure, ResourceExhaustedFailure
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    RetryState,
    TimeoutError,
    TimeoutType,
)
from temporalio.service import RPCError, RPCStatusCode

from posttrain_common.failures import (
    UPDATE_ON_COMPLETED_WORKFLOW,
    temporal_failure,
    tool_error_of,
    update_failure,
    workflow_is_gone,
)
from posttrain_env.errors import ErrorType, GatewayCode, ToolError
from posttrain_env.limits import MAX_ERROR_DETAIL_CHARS, MAX_MESSAGE_CHARS


def rpc_error(status: RPCStatusCode, message: str = "", *details: object) -> RPCError:
    """An RPCError as the SDK raises it: the gRPC status with its details, serialized."""
    packed = []
    for detail in details:
        any_detail = AnyProto()
        any_detail.Pack(detail)  # type: ignore[arg-type]
        packed.append(any_detail)
    raw = GrpcStatus(code=int(status), message=message, details=packed).SerializeToString()
    return RPCError(message, status, raw)


def exhausted(cause: str) -> ResourceExhaustedFailure:
    return ResourceExhaustedFailure(cause=ResourceExhaustedCause.Value(cause))


# -- what a failed call to Temporal means for the caller ---------------------------------------

TRANSIENT = [
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.INTERNAL,
    RPCStatusCode.UNKNOWN,
]
PERMANENT = [
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.ALREADY_EXISTS,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.OUT_OF_RANGE,
    RPCStatusCode.UNIMPLEMENTED,
    RPCStatusCode.DATA_LOSS,
    RPCStatusCode.UNAUTHENTICATED,
]


def test_every_grpc_status_but_ok_is_classified_as_transient_or_permanent() -> None:
    classified = {*TRANSIENT, *PERMANENT, RPCStatusCode.RESOURCE_EXHAUSTED}
    assert classified == set(RPCStatusCode) - {RPCStatusCode.OK}


@pytest.mark.parametrize("status", TRANSIENT, ids=lambda s: s.name)
def test_a_service_that_is_away_or_slow_is_answered_unavailable_and_worth_sending_again(
    status: RPCStatusCode,
) -> None:
    answer = temporal_failure(rpc_error(status, "connection refused"))
    assert (answer.code, answer.status, answer.retryable) == (GatewayCode.unavailable, 503, True)


@pytest.mark.parametrize("status", PERMANENT, ids=lambda s: s.name)
def test_a_request_temporal_refuses_is_permanent_and_never_reported_as_temporary(
    status: RPCStatusCode,
) -> None:
    answer = temporal_failure(rpc_error(status, "no"))
    assert (answer.code, answer.status, answer.retryable) == (GatewayCode.refused, 422, False)
    assert status.name in answer.message and "cannot succeed" in answer.message


def test_temporals_blob_size_refusal_is_permanent() -> None:
    # What the server answers for a payload over `limit.blobSize.error`.
    answer = temporal_failure(
        rpc_error(RPCStatusCode.INVALID_ARGUMENT, "Blob data size exceeds limit.")
    )
    assert answer.code is GatewayCode.refused and not answer.retryable


@pytest.mark.parametrize(
    "cause",
    [
        "RESOURCE_EXHAUSTED_CAUSE_RPS_LIMIT",
        "RESOURCE_EXHAUSTED_CAUSE_CONCURRENT_LIMIT",
        "RESOURCE_EXHAUSTED_CAUSE_SYSTEM_OVERLOADED",
        "RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW",
        "RESOURCE_EXHAUSTED_CAUSE_UNSPECIFIED",
    ],
)
def test_a_rate_or_load_limit_is_transient(cause: str) -> None:
    err = rpc_error(
        RPCStatusCode.RESOURCE_EXHAUSTED, "namespace rate limit exceeded", exhausted(cause)
    )
    assert temporal_failure(err).code is GatewayCode.unavailable


def test_grpcs_own_message_size_refusal_is_payload_too_large_and_permanent() -> None:
    # gRPC refuses a message over its size limit with RESOURCE_EXHAUSTED and no Temporal detail.
    err = rpc_error(RPCStatusCode.RESOURCE_EXHAUSTED, "grpc: received message larger than max")
    answer = temporal_failure(err)
    assert (answer.code, answer.status, answer.retryable) == (
        GatewayCode.payload_too_large,
        413,
        False,
    )


@pytest.mark.parametrize(
    "cause",
    [
        "RESOURCE_EXHAUSTED_CAUSE_PERSISTENCE_STORAGE_LIMIT",
        "RESOURCE_EXHAUSTED_CAUSE_WORKER_DEPLOYMENT_LIMITS",
    ],
)
def test_a_storage_or_deployment_quota_is_permanent(cause: str) -> None:
    err = rpc_error(RPCStatusCode.RESOURCE_EXHAUSTED, "quota", exhausted(cause))
    assert temporal_failure(err).code is GatewayCode.refused


def test_the_answer_is_read_from_the_status_and_its_details_never_from_the_message() -> None:
    too_large_text = "grpc: received message larger than max"
    rate = rpc_error(
        RPCStatusCode.RESOURCE_EXHAUSTED,
        too_large_text,
        exhausted("RESOURCE_EXHAUSTED_CAUSE_RPS_LIMIT"),
    )
    assert temporal_failure(rate).retryable
    invalid = rpc_error(RPCStatusCode.INVALID_ARGUMENT, "temporarily unavailable; retry")
    assert not temporal_failure(invalid).retryable
    other_detail = rpc_error(RPCStatusCode.RESOURCE_EXHAUSTED, "", NotFoundFailure())
    assert temporal_failure(other_detail).code is GatewayCode.payload_too_large


def test_an_unreadable_status_detail_counts_as_no_detail() -> None:
    err = RPCError("too big", RPCStatusCode.RESOURCE_EXHAUSTED, b"\xff\xff not a status")
    assert temporal_failure(err).code is GatewayCode.payload_too_large


def test_a_permanent_answer_is_a_typed_tool_error_that_says_it_is_not_retryable() -> None:
    too_large = temporal_failure(rpc_error(RPCStatusCode.RESOURCE_EXHAUSTED)).tool_error()
    assert too_large.type is ErrorType.invalid_argument
    assert too_large.details == {"code": "PAYLOAD_TOO_LARGE", "retryable": False}
    refused = temporal_failure(rpc_error(RPCStatusCode.PERMISSION_DENIED)).tool_error()
    assert refused.type is ErrorType.hf_error
    assert refused.details == {"code": "REFUSED", "retryable": False}


# -- failures inside Temporal, as the errors agents see ------------------------------------------


def activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="job_logs",
        activity_id="7",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    err.__cause__ = cause
    return err


def test_a_typed_activity_failure_keeps_its_type_message_and_details() -> None:
    cause = ApplicationError(
        "no job job-1", {"job_id": "job-1"}, type="unknown_job", non_retryable=True
    )
    error = tool_error_of(activity_error(cause))
    assert (error.type, error.message, error.details) == (
        ErrorType.unknown_job,
        "no job job-1",
        {"job_id": "job-1"},
    )


def test_an_untyped_failure_is_the_jobs_services_fault() -> None:
    untyped = tool_error_of(activity_error(ApplicationError("boom", type="KeyError")))
    assert untyped.type is ErrorType.hf_error and "boom" in untyped.message
    timed_out = TimeoutError(
        "activity timeout", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[]
    )
    error = tool_error_of(activity_error(timed_out))
    assert error.type is ErrorType.hf_error and "try again later" in error.message


def test_a_failure_quoting_megabytes_is_cut_where_it_becomes_an_agents_error() -> None:
    cause = ApplicationError(
        "m" * 3_000_000, {"requirement": "r" * 3_000_000}, type="invalid_dependency"
    )
    error = tool_error_of(activity_error(cause))
    assert len(error.message) == MAX_MESSAGE_CHARS
    assert len(error.details["requirement"]) == MAX_ERROR_DETAIL_CHARS


def test_a_failed_update_is_the_typed_error_its_handler_raised() -> None:
    typed = update_failure(
        WorkflowUpdateFailedError(ApplicationError("over", type="episode_over")), "the episode"
    )
    assert typed.type is ErrorType.episode_over and typed.message == "over"
    untyped = update_failure(WorkflowUpdateFailedError(ApplicationError("odd")), "the episode")
    assert untyped.type is ErrorType.hf_error
    assert untyped.message.startswith("the episode could not be updated")


def test_a_workflow_is_gone_when_temporal_says_not_found_or_the_update_met_its_end() -> None:
    assert workflow_is_gone(
        rpc_error(RPCStatusCode.NOT_FOUND, "workflow execution already completed")
    )
    assert not workflow_is_gone(rpc_error(RPCStatusCode.UNAVAILABLE))
    assert not workflow_is_gone(rpc_error(RPCStatusCode.INVALID_ARGUMENT))
    ended = WorkflowUpdateFailedError(
        ApplicationError("completed before the update", type=UPDATE_ON_COMPLETED_WORKFLOW)
    )
    assert workflow_is_gone(ended)
    failed = WorkflowUpdateFailedError(ApplicationError("handler failed", type="hf_error"))
    assert not workflow_is_gone(failed)
    assert not workflow_is_gone(ValueError("not Temporal's"))


def test_error_details_an_agent_or_a_job_controls_are_cut_where_they_enter() -> None:
    error = ToolError(ErrorType.invalid_dependency, "bad", requirement="x" * 240_000, count=3)
    assert len(error.details["requirement"]) == MAX_ERROR_DETAIL_CHARS
    assert "cut from 240000" in error.details["requirement"]
    assert error.details["count"] == 3
