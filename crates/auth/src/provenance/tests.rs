//! Unit tests of record provenance: grants, signatures, canonical forms.

use super::*;

fn assignment() -> v1::TaskAssignment {
    v1::TaskAssignment {
        task_id: "t1".into(),
        job_id: "j1".into(),
        attempt: 2,
        agent_id: "a1".into(),
        session_id: "s1".into(),
        worker_id: "worker-b0".into(),
        slice_id: "b0-c0".into(),
        ..Default::default()
    }
}

fn checkpoint(grant: v1::PlacementGrant) -> v1::SessionCheckpoint {
    v1::SessionCheckpoint {
        session_id: "s1".into(),
        job_id: "j1".into(),
        task_id: "t1".into(),
        attempt: 2,
        agent_id: "a1".into(),
        step: 3,
        state_json: b"{}".to_vec(),
        grant: Some(grant),
        ..Default::default()
    }
}

#[test]
fn a_checkpoint_verifies_only_with_the_leaders_grant_and_the_granted_workers_signature() {
    let leader = DecisionSigner::generate();
    let verifier = leader.verifier();
    let worker = WorkerKey::generate();
    let mut grant = grant_for(&assignment(), &worker.public_key());
    leader.sign_grant(&mut grant).expect("grant");
    let mut genuine = checkpoint(grant.clone());
    worker.sign_checkpoint(&mut genuine).expect("sign");
    verifier.verify_checkpoint(&genuine).expect("genuine");

    // Another worker's key, however valid, is not the granted one.
    let mut forged = checkpoint(grant.clone());
    WorkerKey::generate()
        .sign_checkpoint(&mut forged)
        .expect("sign");
    assert!(matches!(
        verifier.verify_checkpoint(&forged),
        Err(ProvenanceError::BadSignature { .. })
    ));
    // A later attempt the grant does not place.
    let mut later = genuine.clone();
    later.attempt = 99;
    worker.sign_checkpoint(&mut later).expect("sign");
    assert!(matches!(
        verifier.verify_checkpoint(&later),
        Err(ProvenanceError::GrantMismatch {
            field: "attempt",
            ..
        })
    ));
    // A grant the forger made itself.
    let mut self_granted = grant.clone();
    DecisionSigner::generate()
        .sign_grant(&mut self_granted)
        .expect("grant");
    let mut fake = checkpoint(self_granted);
    worker.sign_checkpoint(&mut fake).expect("sign");
    assert!(matches!(
        verifier.verify_checkpoint(&fake),
        Err(ProvenanceError::GrantNotSigned { .. })
    ));
    // A changed state after signing.
    let mut changed = genuine.clone();
    changed.step = 4;
    assert!(verifier.verify_checkpoint(&changed).is_err());
    let mut no_grant = genuine;
    no_grant.grant = None;
    assert!(matches!(
        verifier.verify_checkpoint(&no_grant),
        Err(ProvenanceError::NoGrant { .. })
    ));
}

#[test]
fn a_grant_is_known_only_as_its_signer_signed_it() {
    let leader = DecisionSigner::generate();
    let verifier = leader.verifier();
    let worker = WorkerKey::generate();
    let mut grant = grant_for(&assignment(), &worker.public_key());
    leader.sign_grant(&mut grant).expect("grant");
    // The signer's own grant is known to its verifier without a check.
    assert!(
        verifier
            .grants
            .contains(&canonical_grant(&grant), &grant.signature)
    );
    verifier
        .verify_grant(&grant, RecordKind::Checkpoint, "s1")
        .expect("the leader's grant");
    // The same signature over another placement is not the known grant.
    let mut moved = grant.clone();
    moved.slice_id = "b9-c0".into();
    assert!(matches!(
        verifier.verify_grant(&moved, RecordKind::Checkpoint, "s1"),
        Err(ProvenanceError::GrantNotSigned { .. })
    ));
    // Another key's grant over the same placement is refused too.
    let mut forged = grant_for(&assignment(), &worker.public_key());
    DecisionSigner::generate()
        .sign_grant(&mut forged)
        .expect("grant");
    assert!(matches!(
        verifier.verify_grant(&forged, RecordKind::Checkpoint, "s1"),
        Err(ProvenanceError::GrantNotSigned { .. })
    ));
    // A worker's verifier (from the public key alone) checks a grant
    // once, remembers it, and remembers no refusal.
    let on_worker = DecisionVerifier::from_public_key(&leader.public_key()).expect("key");
    assert_eq!(on_worker.grants.len(), 0);
    for _ in 0..2 {
        on_worker
            .verify_grant(&grant, RecordKind::Checkpoint, "s1")
            .expect("the leader's grant");
    }
    assert!(
        on_worker
            .verify_grant(&moved, RecordKind::Checkpoint, "s1")
            .is_err()
    );
    assert_eq!(on_worker.grants.len(), 1);
}

#[test]
fn approval_requests_bind_job_agent_and_session_and_the_leaders_own_are_its_own() {
    let leader = DecisionSigner::generate();
    let verifier = leader.verifier();
    let worker = WorkerKey::generate();
    let mut grant = grant_for(&assignment(), &worker.public_key());
    leader.sign_grant(&mut grant).expect("grant");
    let mut request = v1::ApprovalRequest {
        approval_id: "ap-1".into(),
        job_id: "j1".into(),
        agent_id: "a1".into(),
        session_id: "s1".into(),
        call_id: "c1".into(),
        tool_name: "benchmark".into(),
        arguments_json: "{}".into(),
        grant: Some(grant),
        ..Default::default()
    };
    worker.sign_approval_request(&mut request).expect("sign");
    verifier.verify_approval_request(&request).expect("genuine");
    // Relabelled as another job's, even re-signed by the worker.
    let mut relabelled = request.clone();
    relabelled.job_id = "j2".into();
    worker.sign_approval_request(&mut relabelled).expect("sign");
    assert!(matches!(
        verifier.verify_approval_request(&relabelled),
        Err(ProvenanceError::GrantMismatch { field: "job", .. })
    ));
    // The display changed without a new signature.
    let mut spoofed = request.clone();
    spoofed.tool_name = "read_file".into();
    assert!(verifier.verify_approval_request(&spoofed).is_err());

    let mut own = v1::ApprovalRequest {
        approval_id: "ap-2".into(),
        job_id: "j1".into(),
        agent_id: "leader".into(),
        ..Default::default()
    };
    leader.sign_own_request(&mut own).expect("sign");
    verifier
        .verify_approval_request(&own)
        .expect("the leader's own");
    let mut unsigned = own;
    unsigned.signature.clear();
    assert!(verifier.verify_approval_request(&unsigned).is_err());
}

#[test]
fn derived_keys_are_stable_per_seed_and_not_the_nats_key() {
    let nats = nkeys::KeyPair::new_user();
    let seed = nats.seed().expect("seed");
    let a = WorkerKey::derive(&seed).expect("derive");
    let b = WorkerKey::derive(&seed).expect("derive");
    assert_eq!(a.public_key(), b.public_key());
    assert!(a.public_key().starts_with('C'));
    assert_ne!(&a.public_key()[1..], &nats.public_key()[1..]);
    let other =
        WorkerKey::derive(&nkeys::KeyPair::new_user().seed().expect("seed")).expect("derive");
    assert_ne!(a.public_key(), other.public_key());
    assert!(WorkerKey::derive("junk").is_err());

    // A measurement signature is not a checkpoint's.
    let signature = a.sign(RecordKind::Measurement, "r", b"x").expect("sign");
    verify_record_signature(
        &a.public_key(),
        "w",
        RecordKind::Measurement,
        "r",
        b"x",
        &signature,
    )
    .expect("verifies");
    assert!(
        verify_record_signature(
            &a.public_key(),
            "w",
            RecordKind::Checkpoint,
            "r",
            b"x",
            &signature
        )
        .is_err()
    );
}

#[test]
fn canonical_arguments_sort_keys_and_ignore_spacing() {
    assert_eq!(
        canonical_arguments(r#"{ "b": 1, "a": {"y": [1, 2], "x": "s"} }"#),
        r#"{"a":{"x":"s","y":[1,2]},"b":1}"#
    );
    assert_eq!(
        arguments_digest(r#"{"a":1,"b":2}"#),
        arguments_digest(r#"{ "b":2, "a":1 }"#)
    );
    assert_ne!(
        arguments_digest(r#"{"a":1}"#),
        arguments_digest(r#"{"a":2}"#)
    );
    assert_eq!(canonical_arguments("not json"), "not json");
}
