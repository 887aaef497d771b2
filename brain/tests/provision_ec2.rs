//! The ec2 provider against moto's EC2 server on loopback: RunInstances with tags and the
//! rendered user data (read back with boto3, an independent client), DescribeInstances,
//! TerminateInstances; the join deadline terminating an instance whose worker never joins (no
//! real VM boots here); a brain SIGKILLed between RunInstances and recording its result finds
//! the instance by tag and terminates it; quota refusals; the AWS secret never in the log.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use testkit::{BrainOptions, Cluster, text, wait_until};

const KEY_ID: &str = "AKIATETHERTEST0001";
const SECRET: &str = "tether-test-secret-never-logged-0001";

struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto() -> Result<Moto, String> {
    let ok = Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        return Err("moto is not installed (pip install \"moto[server]\")".into());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .env("MOTO_ENABLE_AMI_VALIDATION", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let m = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let up = wait_until(Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    if !up {
        return Err("moto's server did not start".into());
    }
    Ok(m)
}

/// Runs boto3 against moto: `code` sees `ec2` (a client) and prints JSON.
fn boto(m: &Moto, code: &str) -> serde_json::Value {
    let script = format!(
        "import boto3, json, base64\nec2 = boto3.client('ec2', endpoint_url='{}', region_name='us-east-1', aws_access_key_id='{KEY_ID}', aws_secret_access_key='{SECRET}')\n{code}\n",
        m.url
    );
    let o = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "boto3: {}", text(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("boto3 printed no JSON ({e}): {}", text(&o)))
}

/// State and tags of every instance.
fn instances(m: &Moto) -> Vec<serde_json::Value> {
    let v = boto(
        m,
        "r = ec2.describe_instances()\nprint(json.dumps([{'id': i['InstanceId'], 'state': i['State']['Name'], 'tags': {t['Key']: t['Value'] for t in i.get('Tags', [])}} for res in r['Reservations'] for i in res['Instances']]))",
    );
    v.as_array().cloned().unwrap_or_default()
}

/// EC2 shows `instance` terminated (or on its way there).
fn assert_terminated(m: &Moto, instance: &str) {
    let i = instances(m)
        .into_iter()
        .find(|i| i["id"] == instance)
        .unwrap_or_else(|| panic!("no instance {instance}"));
    assert!(
        i["state"] == "terminated" || i["state"] == "shutting-down",
        "{i}"
    );
}

fn cluster(m: &Moto, extra: &str) -> Cluster {
    let mut opts = BrainOptions {
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\n{extra}\n[provision.ec2]\nendpoint = \"{}\"\nregion = \"us-east-1\"\nami = \"ami-1e749f67\"\ninstance_type = \"t3.micro\"\nworker_url = \"https://downloads.invalid/tether/worker\"\nworker_sha256 = \"{}\"\n",
            m.url,
            "ab".repeat(32)
        )),
        ..BrainOptions::default()
    };
    opts.env = aws_env();
    Cluster::start_with(opts)
}

fn aws_env() -> Vec<(String, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID".into(), KEY_ID.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), SECRET.into()),
    ]
}

fn provision(c: &Cluster) -> std::process::Output {
    c.brain_cli(&["provision", "ec2", "--wait", "0s", "--cpu", "2"])
}

#[test]
fn an_instance_is_launched_tagged_with_its_user_data_and_terminated() {
    let m = match moto() {
        Ok(m) => m,
        Err(why) => {
            testkit::skip("moto", &why);
            return;
        }
    };
    let c = cluster(
        &m,
        "join_timeout = \"1h\"\n[provision.providers.ec2]\nmax_machines = 1",
    );
    let o = provision(&c);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let rec = c.machines(true).remove(0);
    let id = rec["id"].as_str().unwrap().to_string();
    assert_eq!(rec["state"], "joining");
    let instance = rec["handle"].as_str().unwrap().to_string();
    assert!(instance.starts_with("i-"), "{rec}");

    // What EC2 holds, seen through boto3.
    let all = instances(&m);
    let i = all
        .iter()
        .find(|i| i["id"] == instance.as_str())
        .expect("launched");
    assert_eq!(i["state"], "running");
    assert_eq!(i["tags"]["tether.machine"], id.as_str());
    assert!(
        i["tags"]["tether.brain"]
            .as_str()
            .is_some_and(|t| t.len() == 16)
    );
    let ud = boto(
        &m,
        &format!(
            "r = ec2.describe_instance_attribute(InstanceId='{instance}', Attribute='userData')\nprint(json.dumps(base64.b64decode(r['UserData']['Value']).decode()))"
        ),
    );
    let ud = ud.as_str().unwrap();
    assert!(ud.starts_with("#cloud-config\n"), "{ud}");
    assert!(ud.contains(&format!("machine {id}")));
    assert!(ud.contains("--url https://downloads.invalid/tether/worker"));
    assert!(
        ud.contains("content: tj_"),
        "the join token is in the user data"
    );
    let itype = boto(
        &m,
        &format!(
            "r = ec2.describe_instances(InstanceIds=['{instance}'])\nprint(json.dumps(r['Reservations'][0]['Instances'][0]['InstanceType']))"
        ),
    );
    assert_eq!(itype, "t3.micro");

    // The quota counts it.
    let o = provision(&c);
    assert!(!o.status.success());
    assert!(text(&o).contains("at most 1 machine"), "{}", text(&o));

    // Release terminates it.
    let o = c.brain_cli(&["machines", "release", &id]);
    assert!(o.status.success(), "{}", text(&o));
    assert_terminated(&m, &instance);
    assert_eq!(c.machine(&id)["state"], "released");
    // The secret key is nowhere in the brain's log.
    assert!(!c.brain_log().contains(SECRET));
}

#[test]
fn an_instance_whose_worker_never_joins_is_terminated_at_the_deadline() {
    let m = match moto() {
        Ok(m) => m,
        Err(why) => {
            testkit::skip("moto", &why);
            return;
        }
    };
    let c = cluster(&m, "join_timeout = \"3s\"");
    let o = provision(&c);
    assert!(o.status.success(), "{}", text(&o));
    let rec = c.machines(true).remove(0);
    let id = rec["id"].as_str().unwrap().to_string();
    let instance = rec["handle"].as_str().unwrap().to_string();
    assert!(
        wait_until(Duration::from_secs(30), || c.machine(&id)["state"]
            == "released"),
        "{}",
        c.machine(&id)
    );
    assert!(
        c.machine(&id)["note"]
            .as_str()
            .unwrap()
            .contains("did not join")
    );
    assert_terminated(&m, &instance);
}

#[test]
fn a_brain_killed_between_run_instances_and_the_record_terminates_it_after_restart() {
    let m = match moto() {
        Ok(m) => m,
        Err(why) => {
            testkit::skip("moto", &why);
            return;
        }
    };
    let mut c = cluster(&m, "join_timeout = \"3s\"");
    c.kill_brain();
    c.opts.env = aws_env();
    c.opts
        .env
        .push(("TETHER_FAILPOINT".into(), "provision-created".into()));
    c.start_brain().unwrap();
    let o = provision(&c);
    assert!(!o.status.success(), "the brain should have died");
    c.kill_brain();
    let launched = instances(&m);
    assert_eq!(launched.len(), 1, "{launched:?}");
    assert_eq!(launched[0]["state"], "running");
    let instance = launched[0]["id"].as_str().unwrap().to_string();

    c.opts.env = aws_env();
    c.start_brain().unwrap();
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    // Found by its tags and adopted; it never joins, so the deadline terminates it.
    assert!(
        wait_until(Duration::from_secs(30), || c.machine(&id)["state"]
            == "released"),
        "{}",
        c.machine(&id)
    );
    assert_terminated(&m, &instance);
    let log = c.brain_log();
    assert!(
        log.contains("machine adopted"),
        "not found by tag after the restart"
    );
    assert!(!log.contains(SECRET));
}
