"""The history record kinds a workload writes (one home: the report's ladders, the metrics and
the checkers read these names). Every record names the workload in `object` ("nvme", ...)
and the host it happened on.

  workload     a step of the workload: data.step (null_blk, target_up, connect, disconnect,
               target_down, io_start, io_stop; iSER: login, logout; a schedule's teardown:
               leftovers, with data.held), data.ok, data.took_ns, and on a failure data.error
               (the step and what the tool or the kernel said) and data.errno
  ulp_state    a state the kernel ULP reports changed: data.unit (the controller "nvme0"),
               data.state (the kernel's word: live, resetting, connecting, deleting, ...),
               data.previous; data.state "gone" when the unit itself went
  io           the I/O the workload drives, as it goes: data.op ("write"), data.ok and
               data.errors since the last io record, data.error (the first error's text) and
               data.phase: "errors" at the first failed I/O after good ones, "resumed" at the
               first good one after errors, "progress" once a second otherwise
  io_verify    the read-back after recovery: data.blocks, data.acked (blocks whose write was
               acknowledged), data.matched, data.lost_count and data.lost (the first 20 blocks
               holding older data than their acknowledged write), data.corrupt_count and
               data.corrupt (blocks holding no write of the ledger), data.pending (blocks
               holding an unacknowledged write that landed: allowed), data.device
"""

WORKLOAD = "workload"
ULP_STATE = "ulp_state"
IO = "io"
IO_VERIFY = "io_verify"

KINDS = (WORKLOAD, ULP_STATE, IO, IO_VERIFY)

# ulp_state's state when the unit (an NVMe controller) is no longer in sysfs.
GONE = "gone"
