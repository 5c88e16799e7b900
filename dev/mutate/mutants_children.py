"""Mutants of child tasks and the parent waiting on them (G22 and its deadlines): a child
that ends other than by success, a parent whose deadline passes while it waits, a child
made while its parent finishes - the classes issue 35 found no test exercised."""

from __future__ import annotations

from dev.mutate.catalogue import M_CONTROL_FLOW, MIGRATIONS, Mutant, T, m

CHILDREN = T + "test_children.py"
ENDS = CHILDREN + "::test_G23_a_child_that_ends_other_than_by_success_wakes_its_waiting_parent"
LATE_PARENT = (
    CHILDREN
    + "::test_G23_a_child_finishing_after_its_waiting_parents_deadline_leaves_it_to_the_sweep"
)
READS = CHILDREN + "::test_G23_a_parent_reads_how_each_child_ended_not_only_the_successes"
FAN_IN_ENDS = (
    "                       AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'dead')\n"
)
DURABLE = "agentdb/worker/durable.py"

MUTANTS: tuple[Mutant, ...] = (
    # The generated twins of the next two (gen-0006.control_flow-agent_tasks_fan_in-list-2
    # and -list-4) ran only the fan-in's attack case and tests/test_fences.py (a trigger's
    # WHEN is not mapped to the files that name it), which end no child by failing it or
    # by the sweep; generate.py's _STATEMENT_TESTS now adds tests/test_children.py.
    m(
        "children-fan-in-skips-a-failed-child",
        M_CONTROL_FLOW,
        FAN_IN_ENDS,
        FAN_IN_ENDS.replace("'failed', ", ""),
        (T + "test_durable.py::test_G25_a_child_that_fails_is_in_the_results_not_lost", ENDS),
        "agent_tasks_fan_in: a child that fails last never wakes its waiting parent",
    ),
    m(
        "children-fan-in-skips-a-dead-child",
        M_CONTROL_FLOW,
        FAN_IN_ENDS,
        FAN_IN_ENDS.replace(", 'dead'", ""),
        (ENDS,),
        "agent_tasks_fan_in: a child the deadline sweep ends last never wakes its waiting parent",
    ),
    # And of gen-0006.control_flow-agent_tasks_fan_in-and-2, for the same reason.
    m(
        "children-fan-in-on-any-move",
        M_CONTROL_FLOW,
        FAN_IN_ENDS,
        "                       AND true\n",
        (CHILDREN + "::test_G23_a_child_that_only_starts_leaves_its_waiting_parent_alone",),
        "agent_tasks_fan_in: a child's claim, not only its finish, runs the fan-in - a parent "
        "due by its own wait is woken again",
    ),
    # No generated mutant drops a disjunct (the generator's `and` replaces conjuncts only).
    m(
        "children-fan-in-wakes-a-late-parent",
        MIGRATIONS,
        "    IF parent.state IS DISTINCT FROM 'waiting' OR parent.wait_children IS NULL\n"
        "       OR parent.deadline_at <= now() THEN",
        "    IF parent.state IS DISTINCT FROM 'waiting' OR parent.wait_children IS NULL THEN",
        (LATE_PARENT,),
        "agentdb_fan_in: the last child of a parent past its deadline wakes it - the deadline "
        "guard refuses the wake, and with it the child's own finish",
        within="agentdb_fan_in",
    ),
    m(
        "children-result-succeeded-unless-failed",
        DURABLE,
        '        return self.state == "succeeded"',
        '        return self.state != "failed"',
        (READS,),
        "ChildResult.succeeded: a cancelled or dead child reads as succeeded",
        within="ChildResult.succeeded",
    ),
    m(
        "children-result-drops-the-error",
        DURABLE,
        '"result": c.result, "error": c.task.last_error}',
        '"result": c.result, "error": None}',
        (READS,),
        "Durable.run_children: the parent cannot tell why a child was cancelled or died",
        within="Durable.run_children",
    ),
)
