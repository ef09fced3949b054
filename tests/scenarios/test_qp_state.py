"""ibv_query_qp reports the state the last modify (or the provider) set (semantics.md: QP
states). Other scenarios check a QP's state only where the device reports it
(caps.reports_qp_state); this one keeps the devices that do not as a finding."""

import pytest

from rdmalab.api.resources import RCPair


@pytest.mark.finding("siw-query-qp-reports-no-state")
def test_query_reports_rts_then_err(lab):
    pair = RCPair(lab)
    assert pair.a.qp.state == "RTS"
    assert pair.a.qp.query().qp_state == "RTS"
    pair.a.qp.modify(qp_state="ERR")
    assert pair.a.qp.state == "ERR"
