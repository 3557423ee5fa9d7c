"""The promotion lock: concurrent promotions (and rollbacks) of one registered model take turns.

Why a registered model (``<name>.promotion-lock``): names are unique in every MLflow store, so
creating it is an atomic compare-and-set anywhere. A holder older than ``ttl_s`` has crashed and
is broken."""

from __future__ import annotations

import sys
import time
import uuid

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from schemas.errors import MmlinksError, RetryLaterError

LOCK_SUFFIX = ".promotion-lock"
LOCK_TTL_S = 600.0
LOCK_POLL_S = 0.5  # how often a waiting promotion looks at the lock again


def _is_missing(exc: MlflowException) -> bool:
    return "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower()


class PromotionLock:
    """An exclusive lock held as a registered model named ``<name>.promotion-lock``.

    Creation is the atomic step (names are unique). Breaking a stale lock is not atomic in
    MLflow's API: the holder's token is re-read right before the delete to keep the window
    small, and a lock that vanished in between is simply taken again.
    """

    def __init__(
        self,
        client: MlflowClient,
        name: str,
        ttl_s: float = LOCK_TTL_S,
        attempts: int = 5,
        wait_s: float = 0.0,
    ):
        self.client, self.lock_name, self.ttl_s = client, name + LOCK_SUFFIX, ttl_s
        self.token, self.attempts, self.wait_s = uuid.uuid4().hex, attempts, wait_s

    def _try_create(self) -> bool:
        try:
            self.client.create_registered_model(
                self.lock_name,
                tags={"token": self.token, "acquired_at": str(time.time())},
                description="held while a promotion runs; safe to delete if stale",
            )
            return True
        except MlflowException as exc:
            if "already exists" in str(exc).lower() or "RESOURCE_ALREADY_EXISTS" in str(exc):
                return False
            if _is_missing(exc):
                # SQL stores answer a create that lost the race against a holder who already
                # released with "not found" (the store re-reads the conflicting row): contention.
                return False
            raise MmlinksError(f"cannot take the promotion lock: {exc.message}") from exc

    def __enter__(self) -> PromotionLock:
        """Take the lock, waiting up to ``wait_s`` while another holder has it (polling every
        ``LOCK_POLL_S``); a lock older than ``ttl_s`` is a crashed holder's and is broken."""
        deadline = time.monotonic() + self.wait_s
        tries, said = 0, False
        while tries < self.attempts:
            tries += 1
            if self._try_create():
                return self
            try:
                holder = self.client.get_registered_model(self.lock_name)
            except MlflowException as exc:
                if _is_missing(exc):
                    continue  # released between our create and this read: try again
                raise MmlinksError(f"cannot read the promotion lock: {exc.message}") from exc
            age = time.time() - float(holder.tags.get("acquired_at", "0"))
            if age <= self.ttl_s:
                if time.monotonic() < deadline:
                    if not said:  # a wait of up to minutes must not look like a hang
                        said = True
                        print(
                            f"waiting up to {self.wait_s:.0f} s for another promotion of this model "
                            f"to finish (lock {self.lock_name!r}, held {age:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
                    time.sleep(LOCK_POLL_S)
                    tries = 0  # a live holder: waiting is not a failed attempt
                    continue
                waited = f"; waited {self.wait_s:.0f} s" if self.wait_s else ""
                raise RetryLaterError(
                    f"another promotion of this model is in progress (lock {self.lock_name!r}, "
                    f"held {age:.0f} s{waited}); run the same command again once it has finished"
                )
            try:  # a crashed promotion left it behind; break it only if it is still that one
                if self.client.get_registered_model(self.lock_name).tags.get("token") == holder.tags.get(
                    "token"
                ):
                    self.client.delete_registered_model(self.lock_name)
            except MlflowException as exc:
                if not _is_missing(exc):
                    raise MmlinksError(f"cannot break the stale promotion lock: {exc.message}") from exc
        raise MmlinksError(f"could not take the promotion lock {self.lock_name!r}; try again")

    def __exit__(self, *exc) -> None:
        try:
            holder = self.client.get_registered_model(self.lock_name)
            if holder.tags.get("token") == self.token:
                self.client.delete_registered_model(self.lock_name)
        except MlflowException:
            pass  # already broken as stale by someone else; nothing of ours to release
