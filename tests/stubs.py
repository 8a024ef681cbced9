"""Stand-ins for a Kafka source in tests of the run loop (faults a broker cannot produce on
demand)."""

from __future__ import annotations


class ScriptedSource:
    """Polls return scripted record lists; records which max_messages each poll asked for."""

    total = None

    def __init__(self, polls, revoke_after_poll=None, revoked=frozenset()):
        self.polls = list(polls)
        self.asked: list[int] = []
        self.revoke_after_poll, self.revoked = revoke_after_poll, set(revoked)
        self.pending: set = set()
        self.rewound = self.committed = 0

    @property
    def exhausted(self):
        return not self.polls

    def poll(self, max_messages, timeout_s):
        self.asked.append(max_messages)
        if len(self.asked) == self.revoke_after_poll:
            self.pending |= self.revoked
        if not self.polls:
            return []
        batch = self.polls.pop(0)
        assert len(batch) <= max_messages
        return batch

    def take_revoked(self):
        out, self.pending = self.pending, set()
        return out

    def commit(self, batch):
        self.committed += 1

    def rewind(self):
        self.rewound += 1

    def lag(self):
        return {}

    def close(self):
        pass
