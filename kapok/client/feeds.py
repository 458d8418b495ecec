"""How a ``Consumer`` holds a subscription on every pair (its middle layer, above its state).

``Feeding`` adds to ``ConsumerState`` (``kapok.client.consumer_state``) the feeds that the
module docstring of ``kapok.client.consumer`` describes. The client's hook ``_on_view``
starts a feed for each pair of the cluster view, points it at the member that now serves
the pair, and stops it when the pair leaves. A feed (``_run_feed``) makes one attempt after
another: connect and subscribe, hold the subscription until the connection ends
(``_attempt``), report why it ended, back off; an error no retry can mend stops it. The
consumer's status follows the feeds (``_update_status``, also at every ``_tick``).
``Consumer`` above adds the public calls.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from kapok.client.consumer_state import ConsumerState, Feed
from kapok.client.session import NodeSession
from kapok.client.stats import Status
from kapok.client.view import Member
from kapok.errors import (
    AuthError,
    BadRequestError,
    ClientError,
    ConnectionLostError,
    KapokError,
    SubscriptionError,
    UnsupportedError,
)
from kapok.tasks import cancel_and_wait, spawn

__all__ = ["SESSION_CLOSE_S", "Feeding"]

log = logging.getLogger("kapok.client")

_FATAL = (AuthError, BadRequestError, SubscriptionError, UnsupportedError)  # retrying cannot help
SESSION_CLOSE_S = 1.0  # the most a close waits for one connection (each bounds itself below this)


class Feeding(ConsumerState):
    """A subscription on every pair, retried and moved as needed (``Consumer``'s middle layer)."""

    # ------------------------------------------------------------ feeds

    def _on_view(self) -> None:
        if self.status is Status.CLOSED:
            return
        for pair, member in self.view.items():
            feed = self._feeds.get(pair)
            if feed is None:
                feed = self._feeds[pair] = Feed(pair, member)
                feed.task = asyncio.get_running_loop().create_task(self._run_feed(feed))
            elif not feed.member.same_node(member):
                log.info("%s: pair %s is now served by %s", self.name, pair, member.name)
                feed.member = member
                if feed.session is not None:  # the feed reconnects, to the new member
                    spawn(feed.session.close())
        for pair in [p for p in self._feeds if p not in self.view]:
            spawn(self._stop_feed(self._feeds.pop(pair)))
        self._update_status()

    async def _stop_feed(self, feed: Feed) -> None:
        await cancel_and_wait(feed.task)  # its own clean-up closes its session
        if feed.session is not None:
            await self._close_session(feed.session)

    async def _close_session(self, session: NodeSession) -> None:
        try:
            async with asyncio.timeout(SESSION_CLOSE_S):
                await session.close()
        except TimeoutError:
            log.info("%s: %s did not answer our close; dropped", self.name, session.member.name)
        except Exception:  # the connection is being dropped either way
            log.exception("%s: closing the connection to %s failed", self.name, session.member.name)

    async def _run_feed(self, feed: Feed) -> None:
        while True:
            member = feed.member
            began = time.monotonic()
            try:
                error, held = await self._attempt(feed, member)
            except Exception as exc:  # a bug, or an answer nobody foresaw: the feed must go on
                log.exception("%s: the feed from %s failed", self.name, member.name)
                error, held = ConnectionLostError(f"the feed from {member.name} failed: {exc!r}", False), None
            feed.tried = True
            fatal = isinstance(error, _FATAL)
            if not fatal and not feed.member.same_node(member):
                self._changed.set()
                continue  # the pair moved to another member: not a failure, subscribe there now
            now = time.monotonic()
            if held is not None and held >= self.connect_timeout_s:
                feed.failures, feed.failing_since = 0, now  # it worked for a while: a fresh start
            elif feed.failing_since is None:
                feed.failing_since = began
            feed.error = error
            self.stats.node(member.name).failures += 1
            if fatal and self._fatal is None:
                self._fatal = error
            self._update_status()
            self._changed.set()
            self._report(error, in_get=fatal or self._nothing_deliverable(now))
            if fatal:  # reported above (on_error, or raised by start() / get()): not logged twice
                log.info("%s: feed from %s stopped: %s", self.name, member.name, error)
                return
            self.want_refresh()
            delay = self.backoff(feed.failures)
            feed.failures += 1
            log.info("%s: %s; again in %.2f s", self.name, error, delay)
            await asyncio.sleep(delay)

    async def _attempt(self, feed: Feed, member: Member) -> tuple[KapokError, float | None]:
        """One connection of ``feed``, from connect to its end: why it ended, and for how many
        seconds it held the subscription (None: it never did)."""
        topic = self.spec.topic
        try:
            session = await self._connect(member)
        except KapokError as exc:  # each names the node and the reason
            return exc, None
        feed.session = session
        try:
            try:
                await session.subscribe(self.spec, functools.partial(self._deliver, session))
            except ConnectionLostError as exc:
                message = f"the subscription to {topic!r} on {member.name} failed before it was confirmed"
                return ConnectionLostError(f"{message}: {exc}", False), None
            except ClientError as exc:  # raised on this side (UnsupportedError): as it is
                return exc, None
            except KapokError as exc:  # the node's error frame
                exc.args = (f"{member.name} refused the subscription to {topic!r}: {exc.message}",)
                return exc, None
            feed.subscribed = feed.tried = True
            self._subscribed_once = True
            self._update_status()
            self._changed.set()
            since = time.monotonic()
            reason = await session.wait_closed()
            held = time.monotonic() - since
            message = f"the subscription to {topic!r} on {member.name} ended after {held:.2f} s: "
            return ConnectionLostError(message + (reason or "the connection closed"), False), held
        finally:
            feed.subscribed = False
            feed.session = None
            self._forget(session)
            await self._close_session(session)

    def _nothing_deliverable(self, now: float) -> bool:
        """No feed holds a subscription, and each has been failing for ``connect_timeout_s``."""
        feeds = self._feeds.values()
        return bool(feeds) and all(
            not f.live and f.failing_since is not None and now - f.failing_since >= self.connect_timeout_s
            for f in feeds
        )

    def _update_status(self) -> None:
        if self.status is Status.CLOSED:
            return
        live = any(f.live for f in self._feeds.values())
        self._set_status(Status.CONNECTED if live else Status.RECONNECTING)

    def _tick(self, now: float) -> None:
        self._update_status()
