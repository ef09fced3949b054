"""Fault schedules: a schedule is data (JSON) naming hosts, connections, traffic, workloads
(kernel ULPs) and faults, each step at once, after a delay or at a named protocol moment; the
runner plays one on any lab through the Lab protocol, the swarm draws them from a seed, the
shrinker cuts a failing one down, and the differential compares a model's run with a device's.

    from rdmalab.schedules import Schedule, run
    outcome = run(lab, Schedule.load("tests/swarm/schedules/rxe-send-write-read-close.json"))

The modules: schedule (the format: Schedule, ScheduleError, load, validation; pure data),
runner (Runner, Outcome, run), moments (the runner's waits and triggers), ops (the runner's
steps), xrc (the runner's XRC steps), workload_ops (the workload kinds and the runner's
workload steps), swarm (draw, check_run, the seeds run), swarm_workload (a workload
campaign's draw), shrink, differential and scenario (the pytest file device runs go
through); the commands that drive them (`python3 -m rdmalab swarm|replay`) are
rdmalab.run.swarm_cli. The modules import each other directly, never this face.
"""
from .runner import Outcome, Runner, run
from .schedule import (ASYNC_EVENTS, CM_MESSAGES, MOMENTS, OPS, VERB_MOMENTS, Error,
                       FaultNotSupported, Hung, Schedule, ScheduleError, cm_events,
                       cm_protocol_states, load, xrc_srqs)

__all__ = ["ASYNC_EVENTS", "CM_MESSAGES", "MOMENTS", "OPS", "Schedule", "ScheduleError",
           "VERB_MOMENTS", "cm_events", "cm_protocol_states", "xrc_srqs", "load", "run", "Error",
           "FaultNotSupported", "Hung", "Runner", "Outcome"]
