"""SecAggClient: one client's side of a round, as an explicit, serialisable state machine.

    NEW --advertise--> ADVERTISED --share_keys--> SHARED --masked_input--> MASKED
        MASKED --consistency (malicious only)--> SIGNED
        MASKED | SIGNED --unmask--> DONE
    any failed check on a server request --> ABORTED (the client never speaks again)

Calls out of order raise `SecAggStateError` and change nothing. The client reveals, per peer,
either the self-mask seed share (peer survived) or the mask-key share (peer dropped), once:
`unmask` is accepted a single time, its answer is fixed by the survivor set, and in malicious
mode that set must be the one the client signed and ≥ t of its neighbourhood co-signed.

`min_survivors` is a floor the client holds itself (under distributed DP: the fewest
survivors whose noise shares still add up to the calibrated noise). Below it the client
reveals nothing: it refuses to sign the survivor set (malicious mode) and to unmask. In
malicious mode the set it checks is the one its neighbours co-sign, so a server that lies
about it gets no signatures; in semi-honest mode the server could show different sets to
different clients, so there the floor assumes a server that follows the protocol.

Secrets are dropped as soon as they are no longer needed: raw private keys after
`share_keys`, seed and pairwise keys after `masked_input`, held shares after `unmask`.
`to_state()` / `from_state()` move the state through a dict of bytes/int/str values (the
Flower ClientApp record); it holds secrets, so store it like a private key. Restoring an
*older* state after `unmask` would let a server ask again; the host must persist the state
after every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import crypto, randomness, shamir
from .errors import SecAggAborted, SecAggProtocolError, SecAggStateError
from .masking import MaskApplier
from .messages import (
    AdvertiseKeys,
    AdvertiseRequest,
    ConsistencyRequest,
    ConsistencySignature,
    MaskedInput,
    MaskedInputRequest,
    Message,
    ShareKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskShares,
)
from .session import SessionConfig
from .view import SessionView, session_from_bytes
from .wire import decode_members

STATE_VERSION = 1


class ClientStage(str, Enum):
    NEW = "new"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    DONE = "done"
    ABORTED = "aborted"


def _pack_ids(ids: list[int]) -> bytes:
    return np.array(ids, dtype=">u8").tobytes()


def _unpack_ids(raw: bytes) -> list[int]:
    if len(raw) % 8:
        raise ValueError("id list length is not a multiple of 8")
    return np.frombuffer(raw, dtype=">u8").tolist()


def _chunks(raw: bytes, size: int) -> list[bytes]:
    if len(raw) % size:
        raise ValueError(f"blob length {len(raw)} is not a multiple of {size}")
    return [raw[i : i + size] for i in range(0, len(raw), size)]


class SecAggClient:
    """Client protocol state for one session."""

    def __init__(
        self,
        client_id: int,
        session: SessionConfig | SessionView,
        *,
        identity_key: Ed25519PrivateKey | None = None,
        identity_public_keys: Mapping[int, Ed25519PublicKey | bytes] | None = None,
        min_survivors: int = 0,
    ) -> None:
        if type(min_survivors) is not int or min_survivors < 0:
            raise ValueError(f"min_survivors = {min_survivors!r}: must be an int >= 0")
        if isinstance(session, SessionView) and session.holder != client_id:
            raise ValueError(f"the session view is client {session.holder}'s, not {client_id}'s")
        if not session.contains(client_id):
            raise ValueError(f"client {client_id} is not in the session cohort")
        if session.malicious and (identity_key is None or identity_public_keys is None):
            raise ValueError("malicious mode needs identity_key and identity_public_keys")
        self.client_id = client_id
        self.session = session
        self.min_survivors = min_survivors
        self._identity_key = identity_key
        self._identity_public = dict(identity_public_keys or {})
        self.stage = ClientStage.NEW
        # Secrets and per-stage data; see to_state() for which exist in which stage.
        self._mask_pair: crypto.KeyPair | None = None
        self._enc_pair: crypto.KeyPair | None = None
        self._seed = b""
        self._peers: list[int] = []
        self._receive_keys: list[bytes] = []
        self._pair_keys: list[bytes] = []
        self._own_shares = (b"", b"")
        self._held_ids: list[int] = []
        self._held_seed_shares: list[bytes] = []
        self._held_key_shares: list[bytes] = []
        self._signed_survivors = b""

    # --- stages ---------------------------------------------------------------------------

    def advertise(self, request: AdvertiseRequest | None = None) -> AdvertiseKeys:
        """Generate the round's two X25519 key pairs and self-mask seed; publish the keys."""
        self._expect(ClientStage.NEW, "advertise")
        if request is not None:
            request = self._accept(request)
            if not self._same_session(request.session):
                raise self._abort_protocol("advertise_request.session: differs from ours")
        mask_pair, enc_pair = crypto.KeyPair(), crypto.KeyPair()
        self._mask_pair, self._enc_pair = mask_pair, enc_pair
        self._seed = randomness.random_bytes(shamir.SECRET_BYTES)
        digest = self.session.digest
        commitment = crypto.seed_commitment(digest, self.client_id, self._seed)
        signature = b""
        if self.session.malicious:
            assert self._identity_key is not None
            transcript = crypto.advert_transcript(
                digest, self.client_id, mask_pair.public_bytes, enc_pair.public_bytes, commitment
            )
            signature = crypto.sign(self._identity_key, transcript)
        self.stage = ClientStage.ADVERTISED
        return AdvertiseKeys(
            session_id=self.session.session_id,
            client_id=self.client_id,
            mask_public_key=mask_pair.public_bytes,
            encryption_public_key=enc_pair.public_bytes,
            seed_commitment=commitment,
            signature=signature,
        )

    def share_keys(self, request: ShareKeysRequest) -> ShareKeys:
        """Check the neighbours' keys, Shamir-share seed and mask key, encrypt one pair each."""
        self._expect(ClientStage.ADVERTISED, "share_keys")
        request = self._accept(request)
        peers = list(request.peer_ids)
        neighbours = self.session.neighbours_of(self.client_id)
        strangers = [p for p in peers if p not in neighbours]
        if strangers:
            raise self._abort_protocol(
                f"share_keys_request.peer_ids: non-neighbours {strangers[:5]}"
            )
        if len(peers) + 1 < self.session.threshold:
            raise self._abort(
                f"only {len(peers)} neighbours advertised; threshold {self.session.threshold} "
                "cannot be met"
            )
        assert self._mask_pair is not None and self._enc_pair is not None
        mask_pair, enc_pair = self._mask_pair, self._enc_pair
        own_keys = {mask_pair.public_bytes, enc_pair.public_bytes}
        all_keys = [*request.mask_public_keys, *request.encryption_public_keys]
        if len(set(all_keys)) != len(all_keys) or own_keys & set(all_keys):
            raise self._abort_protocol("share_keys_request: repeated public keys")
        if self.session.malicious:
            self._verify_adverts(request)

        digest, me = self.session.digest, self.client_id
        xs = self.session.share_xs([*peers, me])
        t = self.session.threshold
        seed_shares = shamir.split(shamir.secret_to_int(self._seed), t, xs)
        key_shares = shamir.split(shamir.secret_to_int(mask_pair.private_bytes), t, xs)
        nonces = randomness.random_bytes(crypto.NONCE_BYTES * len(peers))
        ciphertexts, receive_keys, pair_keys = [], [], []
        for i, peer in enumerate(peers):
            try:
                enc_shared = enc_pair.agree(request.encryption_public_keys[i])
                mask_shared = mask_pair.agree(request.mask_public_keys[i])
            except ValueError:
                raise self._abort_protocol(
                    f"share_keys_request: invalid public key of peer {peer}"
                ) from None
            send_key, receive_key = crypto.share_channel_keys(enc_shared, digest, me, peer)
            receive_keys.append(receive_key)
            pair_keys.append(crypto.pairwise_mask_key(mask_shared, digest, me, peer))
            plaintext = shamir.encode_share(seed_shares[i]) + shamir.encode_share(key_shares[i])
            nonce = nonces[crypto.NONCE_BYTES * i : crypto.NONCE_BYTES * (i + 1)]
            associated = crypto.share_associated_data(digest, me, peer)
            ciphertexts.append(crypto.seal(send_key, plaintext, associated, nonce))
        self._peers, self._receive_keys, self._pair_keys = peers, receive_keys, pair_keys
        self._own_shares = (
            shamir.encode_share(seed_shares[-1]),
            shamir.encode_share(key_shares[-1]),
        )
        self._mask_pair = self._enc_pair = None  # everything later needs only derived keys
        self.stage = ClientStage.SHARED
        return ShareKeys(
            session_id=self.session.session_id,
            client_id=self.client_id,
            recipient_ids=tuple(peers),
            ciphertexts=tuple(ciphertexts),
        )

    def check_masked_input(self, request: MaskedInputRequest) -> None:
        """The checks `masked_input` makes before it needs the vector (nothing changes).

        The input is computed (trained) on receipt of this request: a request the
        session would refuse is refused before that work, not after.
        """
        self._expect(ClientStage.SHARED, "masked_input")
        if not isinstance(request, MaskedInputRequest):
            raise SecAggProtocolError(f"{type(request).__name__} is not a masked_input request")
        self._accept(request)

    def masked_input(
        self, request: MaskedInputRequest, vector: np.ndarray, *, overwrite_input: bool = False
    ) -> MaskedInput:
        """Store the neighbours' shares and return vector + self mask ± pairwise masks mod 2^b.

        With `overwrite_input` the masks are added into `vector` itself (no copy): for callers
        that made the vector for this call and have no further use for it.
        """
        self._expect(ClientStage.SHARED, "masked_input")
        self._check_vector(vector)
        request = self._accept(request)
        index = {peer: i for i, peer in enumerate(self._peers)}
        strangers = [s for s in request.sender_ids if s not in index]
        if strangers:
            raise self._abort_protocol(
                f"masked_input_request.sender_ids: not our peers {strangers[:5]}"
            )
        if len(request.sender_ids) + 1 < self.session.threshold:
            raise self._abort(
                f"only {len(request.sender_ids)} neighbours hold our shares; threshold "
                f"{self.session.threshold} cannot be met"
            )
        digest = self.session.digest
        invalid: list[int] = []
        for sender, ciphertext in zip(request.sender_ids, request.ciphertexts, strict=True):
            associated = crypto.share_associated_data(digest, sender, self.client_id)
            plaintext = crypto.open_sealed(
                self._receive_keys[index[sender]], ciphertext, associated
            )
            if plaintext is None or any(
                shamir.decode_share(part) is None
                for part in (plaintext[: shamir.SHARE_BYTES], plaintext[shamir.SHARE_BYTES :])
            ):
                # Still mask with the sender (masks must cancel); just hold no share of it.
                invalid.append(sender)
                continue
            self._held_ids.append(sender)
            self._held_seed_shares.append(plaintext[: shamir.SHARE_BYTES])
            self._held_key_shares.append(plaintext[shamir.SHARE_BYTES :])

        applier = MaskApplier(self.session.dimension, self.session.dtype, self.session.modulus_bits)
        self_key = crypto.self_mask_key(self._seed, digest, self.client_id)
        if overwrite_input:
            masked = vector
            applier.add(masked, self_key)
        else:
            masked = applier.fresh(self_key)
            np.add(masked, vector, out=masked)
        for sender in request.sender_ids:
            # The smaller id adds the pairwise mask, the larger subtracts it: they cancel.
            key = self._pair_keys[index[sender]]
            if self.client_id < sender:
                applier.add(masked, key)
            else:
                applier.subtract(masked, key)
        applier.reduce(masked)
        self._seed, self._pair_keys, self._receive_keys = b"", [], []
        self.stage = ClientStage.MASKED
        return MaskedInput(
            session_id=self.session.session_id,
            client_id=self.client_id,
            invalid_share_senders=tuple(invalid),
            masked_vector=masked,
        )

    def consistency(self, request: ConsistencyRequest) -> ConsistencySignature:
        """Malicious mode: sign the survivor set U3 the server announced."""
        if not self.session.malicious:
            raise SecAggStateError("consistency: only used in malicious mode")
        self._expect(ClientStage.MASKED, "consistency")
        request = self._accept(request)
        self._survivors(request.survivors, None, "consistency_request.survivors")
        assert self._identity_key is not None
        transcript = crypto.survivors_transcript(
            self.session.digest, self.client_id, request.survivors
        )
        self._signed_survivors = request.survivors
        self.stage = ClientStage.SIGNED
        return ConsistencySignature(
            session_id=self.session.session_id,
            client_id=self.client_id,
            signature=crypto.sign(self._identity_key, transcript),
        )

    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Reveal, per held peer, the seed share (survivor) or the mask-key share (dropped)."""
        expected = ClientStage.SIGNED if self.session.malicious else ClientStage.MASKED
        self._expect(expected, "unmask")
        request = self._accept(request)
        if self.session.malicious:
            self._check_cosigned(request)
        survivors = self._survivors(
            request.survivors, request.survivor_count, "unmask_request.survivors"
        )
        seed_ids, seed_shares, key_ids, key_shares = [self.client_id], [self._own_shares[0]], [], []
        for peer, seed_share, key_share in zip(
            self._held_ids, self._held_seed_shares, self._held_key_shares, strict=True
        ):
            if peer in survivors:
                seed_ids.append(peer)
                seed_shares.append(seed_share)
            else:
                key_ids.append(peer)
                key_shares.append(key_share)
        self._forget_shares()
        self.stage = ClientStage.DONE
        return UnmaskShares(
            session_id=self.session.session_id,
            client_id=self.client_id,
            seed_owner_ids=tuple(seed_ids),
            seed_shares=tuple(seed_shares),
            key_owner_ids=tuple(key_ids),
            key_shares=tuple(key_shares),
        )

    def respond(
        self, request: Message, vector: np.ndarray | None = None, *, overwrite_input: bool = False
    ) -> Message:
        """Dispatch a decoded server request to its stage method (`vector` and
        `overwrite_input`: masked_input only)."""
        if isinstance(request, AdvertiseRequest):
            return self.advertise(request)
        if isinstance(request, ShareKeysRequest):
            return self.share_keys(request)
        if isinstance(request, MaskedInputRequest):
            if vector is None:
                raise ValueError("masked_input needs the input vector")
            return self.masked_input(request, vector, overwrite_input=overwrite_input)
        if isinstance(request, ConsistencyRequest):
            return self.consistency(request)
        if isinstance(request, UnmaskRequest):
            return self.unmask(request)
        raise SecAggProtocolError(f"{type(request).__name__} is not a server request")

    # --- checks ---------------------------------------------------------------------------

    def _expect(self, stage: ClientStage, call: str) -> None:
        if self.stage is not stage:
            raise SecAggStateError(
                f"client {self.client_id}: {call}() needs stage {stage.value}, "
                f"current stage is {self.stage.value}"
            )

    def _accept(self, request: Message) -> Message:  # type: ignore[override]
        """Decoder checks, then: this session, addressed to us. Replays are rejected, not fatal."""
        request = request.validated()
        if request.session_id != self.session.session_id:
            raise SecAggProtocolError(f"{request.KIND}.session_id: not this session (replay?)")
        if request.client_id != self.client_id:
            raise SecAggProtocolError(f"{request.KIND}.client_id: addressed to another client")
        return request

    def _check_vector(self, vector: np.ndarray) -> None:
        session = self.session
        if not isinstance(vector, np.ndarray) or vector.dtype != np.dtype(session.dtype):
            raise ValueError(f"input vector must be a numpy {np.dtype(session.dtype).name} array")
        if vector.shape != (session.dimension,):
            raise ValueError(f"input vector shape {vector.shape} != ({session.dimension},)")
        if (
            session.modulus_bits < vector.dtype.itemsize * 8
            and vector.size
            and (int(vector.max()) > session.modulus_mask)
        ):
            raise ValueError(f"input values must be < 2^{session.modulus_bits}")

    def _verify_adverts(self, request: ShareKeysRequest) -> None:
        digest = self.session.digest
        for i, peer in enumerate(request.peer_ids):
            identity = self._identity_public.get(peer)
            if identity is None:
                raise self._abort_protocol(
                    f"share_keys_request.peer_ids[{i}]: peer {peer} is not in this client's "
                    "roster (an operator who added it must give this device the new roster)"
                )
            transcript = crypto.advert_transcript(
                digest,
                peer,
                request.mask_public_keys[i],
                request.encryption_public_keys[i],
                request.seed_commitments[i],
            )
            if not crypto.verify(
                crypto.load_identity_public(identity), request.signatures[i], transcript
            ):
                raise self._abort_protocol(
                    f"share_keys_request.signatures[{i}]: advertisement of peer {peer} "
                    "is not signed by its identity key"
                )

    def _survivor_order(self) -> np.ndarray:
        """What a survivor bitmap is over: the cohort in malicious mode (the set is signed),
        this client's neighbourhood in semi-honest mode."""
        session = self.session
        if session.malicious or isinstance(session, SessionView):
            return session.ids_array
        hood = session.neighbours_of(self.client_id) | {self.client_id}
        return np.array(sorted(hood), dtype=np.uint64)

    def _survivors(self, bitmap: bytes, count: int | None, path: str) -> frozenset[int]:
        """The survivors the bitmap marks (semi-honest: those of our neighbourhood), after
        checking `count`, the number of survivors in the whole cohort."""
        try:
            survivors = decode_members(path, bitmap, self._survivor_order())
        except SecAggProtocolError as exc:
            raise self._abort_protocol(str(exc)) from None
        if count is None:
            count = len(survivors)
        if count < len(survivors) or (self.session.malicious and count != len(survivors)):
            raise self._abort_protocol(
                f"{path}: survivor_count {count} contradicts the {len(survivors)} marked"
            )
        if self.client_id not in survivors:
            raise self._abort_protocol(f"{path}: marks this client, which sent its input, dropped")
        if count < self.min_survivors:
            # Checked before anything is signed or revealed: the client's own floor.
            raise self._abort(
                f"{path}: {count} survivors < {self.min_survivors}, the fewest this "
                "client unmasks for; no share revealed"
            )
        holders_alive = 1 + sum(1 for peer in self._held_ids if peer in survivors)
        if count < self.session.threshold or holders_alive < self.session.threshold:
            raise self._abort(f"too few survivors to unmask safely ({path})")
        return survivors

    def _same_session(self, received: SessionConfig | SessionView) -> bool:
        """The advertised session is ours (or, holding the full config, our view of it)."""
        mine = self.session
        if isinstance(received, SessionView) and isinstance(mine, SessionConfig):
            if mine.malicious or not mine.contains(received.holder):
                return False
            mine = SessionView.of(mine, self.client_id, mine.neighbours_of(self.client_id))
        return received == mine

    def _check_cosigned(self, request: UnmaskRequest) -> None:
        if request.survivors != self._signed_survivors:
            raise self._abort_protocol(
                "unmask_request.survivors: differs from the set this client signed"
            )
        neighbours = self.session.neighbours_of(self.client_id)
        for i, signer in enumerate(request.signer_ids):
            identity = self._identity_public.get(signer)
            transcript = crypto.survivors_transcript(self.session.digest, signer, request.survivors)
            if (
                signer not in neighbours
                or identity is None
                or not crypto.verify(
                    crypto.load_identity_public(identity), request.signatures[i], transcript
                )
            ):
                raise self._abort_protocol(
                    f"unmask_request.signatures[{i}]: signer {signer} did not sign this "
                    "survivor set (the server may be equivocating)"
                )
        if len(request.signer_ids) + 1 < self.session.threshold:
            raise self._abort(
                f"only {len(request.signer_ids) + 1} consistent signatures; "
                f"need {self.session.threshold}"
            )

    def _abort(self, reason: str) -> SecAggAborted:
        self._wipe()
        self.stage = ClientStage.ABORTED
        return SecAggAborted(f"client {self.client_id}: {reason}")

    def _abort_protocol(self, reason: str) -> SecAggProtocolError:
        self._wipe()
        self.stage = ClientStage.ABORTED
        return SecAggProtocolError(f"client {self.client_id} aborted: {reason}")

    def _forget_shares(self) -> None:
        self._held_ids, self._held_seed_shares, self._held_key_shares = [], [], []
        self._own_shares = (b"", b"")

    def _wipe(self) -> None:
        self._mask_pair = self._enc_pair = None
        self._seed = b""
        self._pair_keys, self._receive_keys = [], []
        self._forget_shares()

    # --- persistence ----------------------------------------------------------------------

    def to_state(self) -> dict[str, bytes | int | str]:
        """Everything needed to resume, as simple values. Contains secrets."""
        state: dict[str, bytes | int | str] = {
            "version": STATE_VERSION,
            "client_id": self.client_id,
            "stage": self.stage.value,
            "session": self.session.to_bytes(),
        }
        if self.stage is ClientStage.ADVERTISED:
            assert self._mask_pair is not None and self._enc_pair is not None
            state.update(
                mask_sk=self._mask_pair.private_bytes,
                enc_sk=self._enc_pair.private_bytes,
                seed=self._seed,
            )
        if self.stage is ClientStage.SHARED:
            state.update(
                seed=self._seed,
                peers=_pack_ids(self._peers),
                receive_keys=b"".join(self._receive_keys),
                pair_keys=b"".join(self._pair_keys),
            )
        if self.stage in (ClientStage.SHARED, ClientStage.MASKED, ClientStage.SIGNED):
            state.update(own_seed_share=self._own_shares[0], own_key_share=self._own_shares[1])
        if self.stage in (ClientStage.MASKED, ClientStage.SIGNED):
            state.update(
                held_ids=_pack_ids(self._held_ids),
                held_seed_shares=b"".join(self._held_seed_shares),
                held_key_shares=b"".join(self._held_key_shares),
            )
        if self.stage is ClientStage.SIGNED:
            state["signed_survivors"] = self._signed_survivors
        return state

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, bytes | int | str],
        *,
        identity_key: Ed25519PrivateKey | None = None,
        identity_public_keys: Mapping[int, Ed25519PublicKey | bytes] | None = None,
        min_survivors: int = 0,
    ) -> SecAggClient:
        """Inverse of `to_state`; raises SecAggProtocolError on any malformed entry.
        `min_survivors` is not in the state: the host passes its own floor on every restore."""
        try:
            if state.get("version") != STATE_VERSION:
                raise ValueError("unsupported state version")
            raw_session = state["session"]
            client_id = state["client_id"]
            if type(raw_session) is not bytes or type(client_id) is not int:
                raise ValueError("session/client_id have wrong types")
            client = cls(
                client_id,
                session_from_bytes(raw_session),
                identity_key=identity_key,
                identity_public_keys=identity_public_keys,
                min_survivors=min_survivors,
            )
            client.stage = ClientStage(state["stage"])
            client._load(state)
        except (KeyError, ValueError, TypeError) as exc:
            raise SecAggProtocolError(f"client state: {exc}") from None
        return client

    def _load(self, state: Mapping[str, bytes | int | str]) -> None:
        def blob(name: str, size: int | None = None) -> bytes:
            value = state[name]
            if type(value) is not bytes or (size is not None and len(value) != size):
                raise ValueError(f"{name} must be {size if size else 'some'} bytes")
            return value

        key_len, share_len = crypto.KEY_BYTES, shamir.SHARE_BYTES
        if self.stage is ClientStage.ADVERTISED:
            self._mask_pair = crypto.KeyPair(blob("mask_sk", key_len))
            self._enc_pair = crypto.KeyPair(blob("enc_sk", key_len))
            self._seed = blob("seed", key_len)
        if self.stage is ClientStage.SHARED:
            self._seed = blob("seed", key_len)
            self._peers = _unpack_ids(blob("peers"))
            self._receive_keys = _chunks(blob("receive_keys"), key_len)
            self._pair_keys = _chunks(blob("pair_keys"), key_len)
            if not len(self._peers) == len(self._receive_keys) == len(self._pair_keys):
                raise ValueError("peer key lists differ in length")
        if self.stage in (ClientStage.SHARED, ClientStage.MASKED, ClientStage.SIGNED):
            self._own_shares = (blob("own_seed_share", share_len), blob("own_key_share", share_len))
        if self.stage in (ClientStage.MASKED, ClientStage.SIGNED):
            self._held_ids = _unpack_ids(blob("held_ids"))
            self._held_seed_shares = _chunks(blob("held_seed_shares"), share_len)
            self._held_key_shares = _chunks(blob("held_key_shares"), share_len)
            if not len(self._held_ids) == len(self._held_seed_shares) == len(self._held_key_shares):
                raise ValueError("held share lists differ in length")
        if self.stage is ClientStage.SIGNED:
            self._signed_survivors = blob("signed_survivors")
