//! The secrets store: sealing, bindings, placeholders, refusals.

use super::*;

fn info(name: &str, hosts: &[&str]) -> SecretInfo {
    SecretInfo {
        name: name.into(),
        hosts: hosts
            .iter()
            .map(|h| HostPattern::parse(h).unwrap())
            .collect(),
        port: 443,
        inject: Inject::Bearer,
        env: default_env(name),
        tier: Tier::Command,
        updated_unix_ms: 0,
    }
}

async fn store(dir: &Path) -> (sled::Db, Secrets) {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let s = Secrets::open(&db, &dir.join("secrets.key")).await.unwrap();
    (db, s)
}

#[tokio::test]
async fn a_value_is_sealed_at_rest_and_opens_only_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = store(dir.path()).await;
    let value = b"ghp_verysecretvalue123456".to_vec();
    assert!(
        !s.set(
            info("github", &["api.github.com"]),
            Value::new(value.clone())
        )
        .await
        .unwrap()
    );
    // Nowhere in the store in clear.
    for t in db.tree_names() {
        for kv in db.open_tree(t).unwrap().iter() {
            let (_, v) = kv.unwrap();
            assert!(!v.windows(value.len()).any(|w| w == value.as_slice()));
        }
    }
    assert_eq!(
        s.reveal("github").await.unwrap().1.expose(),
        value.as_slice()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("secrets.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Another key cannot open it, and says so.
    std::fs::write(dir.path().join("other.key"), hex::encode([7u8; 32])).unwrap();
    std::fs::set_permissions(
        dir.path().join("other.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let other = Secrets::open(&db, &dir.path().join("other.key"))
        .await
        .unwrap();
    assert!(matches!(
        other.reveal("github").await,
        Err(Error::Unseal(_))
    ));
    // A missing key with sealed secrets is an error, not a new key.
    assert!(matches!(
        Secrets::open(&db, &dir.path().join("gone.key")).await,
        Err(Error::KeyMissing { .. })
    ));
}

#[tokio::test]
async fn a_sealed_value_moved_to_another_name_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = store(dir.path()).await;
    s.set(info("a", &["a.example.com"]), Value::new(b"one".to_vec()))
        .await
        .unwrap();
    s.set(info("b", &["b.example.com"]), Value::new(b"two".to_vec()))
        .await
        .unwrap();
    let mut rec_a: Record =
        serde_json::from_slice(&s.tree.get(b"a").await.unwrap().unwrap()).unwrap();
    rec_a.info.name = "b".into();
    s.tree
        .insert(b"b", &serde_json::to_vec(&rec_a).unwrap())
        .await
        .unwrap();
    assert!(s.reveal("b").await.is_err());
}

#[tokio::test]
async fn a_record_edited_to_rebind_or_lower_a_secret_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = store(dir.path()).await;
    let mut provider = info("llm", &["api.example.com"]);
    provider.tier = Tier::Provider;
    s.set(provider, Value::new(b"sk-provider".to_vec()))
        .await
        .unwrap();
    type Edit = fn(&mut SecretInfo);
    let edits: [(&str, Edit); 5] = [
        ("hosts", |i| {
            i.hosts = vec![HostPattern::parse("evil.example").unwrap()]
        }),
        ("port", |i| i.port = 8443),
        ("inject", |i| i.inject = Inject::Query("k".into())),
        ("env", |i| i.env = "OTHER".into()),
        ("tier", |i| i.tier = Tier::Command),
    ];
    let original = s.tree.get(b"llm").await.unwrap().unwrap();
    for (what, edit) in edits {
        let mut rec: Record = serde_json::from_slice(&original).unwrap();
        edit(&mut rec.info);
        s.tree
            .insert(b"llm", &serde_json::to_vec(&rec).unwrap())
            .await
            .unwrap();
        for err in [
            s.reveal("llm").await.unwrap_err(),
            s.info("llm").await.unwrap_err(),
            s.list().await.unwrap_err(),
            s.for_task(&["llm".into()]).await.unwrap_err(),
        ] {
            assert!(matches!(err, Error::Unseal(_)), "{what}: {err}");
            assert!(err.to_string().contains("brain secret set llm"), "{err}");
        }
        assert!(s.values().await.unwrap().is_empty(), "{what}");
    }
    // A version-1 record (its seal bound the name only) is refused the same way.
    let mut rec: Record = serde_json::from_slice(&original).unwrap();
    rec.v = 1;
    s.tree
        .insert(b"llm", &serde_json::to_vec(&rec).unwrap())
        .await
        .unwrap();
    assert!(matches!(s.reveal("llm").await, Err(Error::Binding(_))));
    // Put back as it was, it opens.
    s.tree.insert(b"llm", &original).await.unwrap();
    assert_eq!(s.reveal("llm").await.unwrap().1.expose(), b"sk-provider");
}

#[tokio::test]
async fn bad_secrets_are_refused_and_listing_never_shows_values() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = store(dir.path()).await;
    for (i, v) in [
        (info("x", &["h.example.com"]), b"".to_vec()),
        (info("x", &["h.example.com"]), b"a\nb".to_vec()),
        (info("x", &[]), b"v".to_vec()),
        (info("Bad", &["h.example.com"]), b"v".to_vec()),
    ] {
        assert!(matches!(
            s.set(i, Value::new(v)).await,
            Err(Error::Invalid(_))
        ));
    }
    let mut i = info("npm", &["registry.npmjs.org"]);
    i.env = "PATH".into();
    assert!(s.set(i, Value::new(b"v".to_vec())).await.is_err());
    s.set(
        info("npm", &["registry.npmjs.org"]),
        Value::new(b"tok".to_vec()),
    )
    .await
    .unwrap();
    let list = s.list().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].env, "NPM");
    assert!(!format!("{list:?}").contains("tok"));
    assert!(s.remove("npm").await.unwrap());
    assert!(!s.remove("npm").await.unwrap());
    assert!(s.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn placeholders_differ_per_task_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = store(dir.path()).await;
    let p1 = s.placeholder("t-1", "github");
    assert!(p1.starts_with("tether-secret:github:"));
    assert_ne!(p1, s.placeholder("t-2", "github"));
    assert_ne!(p1, s.placeholder("t-1", "npm"));
    let again = Secrets::open(&db, &dir.path().join("secrets.key"))
        .await
        .unwrap();
    assert_eq!(p1, again.placeholder("t-1", "github"));
}

#[tokio::test]
async fn a_provider_key_is_never_a_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = store(dir.path()).await;
    let mut i = info("openai", &[]);
    i.tier = Tier::Provider;
    s.set(i, Value::new(b"sk-x".to_vec())).await.unwrap();
    assert!(s.for_task(&["openai".into()]).await.is_err());
    assert!(matches!(
        s.for_task(&["nope".into()]).await,
        Err(Error::Unknown(_))
    ));
}

#[test]
fn host_patterns_and_injections_parse_as_written() {
    let exact = HostPattern::parse("API.GitHub.com").unwrap();
    assert!(exact.matches("api.github.com"));
    assert!(exact.matches("api.github.com."));
    assert!(!exact.matches("xapi.github.com"));
    for bad in [
        "",
        "*.",
        "*.com",
        "a b",
        "-a.com",
        "a..b",
        "http://x.com",
        "*",
    ] {
        assert!(HostPattern::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        Inject::parse("basic:git").unwrap(),
        Inject::Basic("git".into())
    );
    assert_eq!(
        Inject::parse("header:X-Api-Key").unwrap(),
        Inject::Header("X-Api-Key".into())
    );
    assert!(Inject::parse("header:").is_err());
    assert!(Inject::parse("header:Host").is_err());
    assert!(Inject::parse("cookie").is_err());
}
