//! moto's AWS server on loopback, as strict as it gets: EC2 with AMI, instance-type and
//! key-pair validation on, and IAM authentication and authorisation enforced (SigV4 checked
//! against access keys made through IAM, each call against the caller's policies). Users,
//! roles and keys are made while enforcement is still off; [`Moto::enforce`] turns it on.
//! boto3 (an independent client) reads back what the brain made.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The policy the README asks for: what the brain's ec2 provider calls (turning the
/// metadata service off once a worker has joined among them).
pub const BRAIN_POLICY: &str = r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateTags", "ec2:DescribeInstances", "ec2:TerminateInstances", "ec2:ModifyInstanceMetadataOptions"], "Resource": "*"}]}"#;

/// An AMI moto knows.
pub const AMI: &str = "ami-1e749f67";

/// An access key made through IAM.
#[derive(Debug, Clone)]
pub struct Key {
    pub id: String,
    pub secret: String,
}

/// A running moto server; killed on drop.
pub struct Moto {
    child: Child,
    pub url: String,
    /// A key allowed everything, for reading back (boto3) and setting up.
    pub admin: Key,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts moto (strict EC2 validation; authentication not yet enforced) and makes an
    /// administrator's key.
    pub fn start() -> Result<Moto, String> {
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
            .env("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
            .env("MOTO_ENABLE_KEYPAIR_VALIDATION", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut m = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
            admin: Key {
                id: "AKIAUNUSED0000000000".into(),
                secret: "unused".into(),
            },
        };
        let up = crate::wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if !up {
            return Err("moto's server did not start".into());
        }
        m.admin = m.user(
            "tether-admin",
            r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}"#,
        );
        Ok(m)
    }

    /// Runs Python with boto3 against moto: `code` sees `session` (a boto3 session with
    /// `key`) and `url`, and prints JSON.
    pub fn python(&self, key: &Key, code: &str) -> Result<Value, String> {
        let script = format!(
            "import boto3, json, base64\nsession = boto3.session.Session(aws_access_key_id={:?}, aws_secret_access_key={:?}, region_name='us-east-1')\nurl = {:?}\n{code}\n",
            key.id, key.secret, self.url
        );
        let o = Command::new("python3")
            .args(["-c", &script])
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        serde_json::from_slice(&o.stdout).map_err(|e| {
            format!(
                "printed no JSON ({e}): {}",
                String::from_utf8_lossy(&o.stdout)
            )
        })
    }

    /// [`Self::python`] with `ec2`, a client, as the administrator; panics on failure.
    pub fn ec2(&self, code: &str) -> Value {
        self.python(
            &self.admin,
            &format!("ec2 = session.client('ec2', endpoint_url=url)\n{code}"),
        )
        .unwrap_or_else(|e| panic!("boto3: {e}"))
    }

    /// A new IAM user with `policy` attached, and an access key for it.
    pub fn user(&self, name: &str, policy: &str) -> Key {
        let v = self
            .python(
                &self.admin,
                &format!(
                    "iam = session.client('iam', endpoint_url=url)\n\
                     iam.create_user(UserName={name:?})\n\
                     p = iam.create_policy(PolicyName={name:?} + '-policy', PolicyDocument={policy:?})\n\
                     iam.attach_user_policy(UserName={name:?}, PolicyArn=p['Policy']['Arn'])\n\
                     k = iam.create_access_key(UserName={name:?})['AccessKey']\n\
                     print(json.dumps([k['AccessKeyId'], k['SecretAccessKey']]))"
                ),
            )
            .unwrap_or_else(|e| panic!("making IAM user {name}: {e}"));
        Key {
            id: v[0].as_str().unwrap().to_string(),
            secret: v[1].as_str().unwrap().to_string(),
        }
    }

    /// Another access key of an existing user.
    pub fn another_key(&self, user: &str) -> Key {
        let v = self
            .python(
                &self.admin,
                &format!(
                    "iam = session.client('iam', endpoint_url=url)\n\
                     k = iam.create_access_key(UserName={user:?})['AccessKey']\n\
                     print(json.dumps([k['AccessKeyId'], k['SecretAccessKey']]))"
                ),
            )
            .unwrap_or_else(|e| panic!("making a key for {user}: {e}"));
        Key {
            id: v[0].as_str().unwrap().to_string(),
            secret: v[1].as_str().unwrap().to_string(),
        }
    }

    /// Deletes an access key: calls signed with it fail from now on.
    pub fn delete_key(&self, user: &str, key: &Key) {
        self.python(
            &self.admin,
            &format!(
                "iam = session.client('iam', endpoint_url=url)\n\
                 iam.delete_access_key(UserName={user:?}, AccessKeyId={:?})\nprint('{{}}')",
                key.id
            ),
        )
        .unwrap_or_else(|e| panic!("deleting a key of {user}: {e}"));
    }

    /// A role `name` the user `trusted` may assume (moto, like IAM, matches the trust
    /// policy's principal), with `policy` attached; its ARN.
    pub fn role(&self, name: &str, trusted: &str, policy: &str) -> String {
        let v = self
            .python(
                &self.admin,
                &format!(
                    "iam = session.client('iam', endpoint_url=url)\n\
                     trust = json.dumps({{'Version': '2012-10-17', 'Statement': [{{'Effect': 'Allow', 'Principal': {{'AWS': 'arn:aws:iam::123456789012:user/{trusted}'}}, 'Action': 'sts:AssumeRole'}}]}})\n\
                     r = iam.create_role(RoleName={name:?}, AssumeRolePolicyDocument=trust)\n\
                     iam.put_role_policy(RoleName={name:?}, PolicyName={name:?} + '-policy', PolicyDocument={policy:?})\n\
                     print(json.dumps(r['Role']['Arn']))"
                ),
            )
            .unwrap_or_else(|e| panic!("making role {name}: {e}"));
        v.as_str().unwrap().to_string()
    }

    /// From now on every call must be signed with a key IAM knows and be allowed by its
    /// policies.
    pub fn enforce(&self) {
        let port: u16 = self
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .expect("moto's URL names its port");
        let (status, answer) = crate::http::request(
            port,
            "POST",
            "/moto-api/reset-auth",
            "text/plain",
            b"0".to_vec(),
            std::time::Duration::from_secs(30),
        )
        .expect("moto listens");
        assert_eq!(
            status,
            200,
            "moto refused to enforce authentication: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// Every instance: id, state and tags.
    pub fn instances(&self) -> Vec<Value> {
        let v = self.ec2(
            "r = ec2.describe_instances()\nprint(json.dumps([{'id': i['InstanceId'], 'state': i['State']['Name'], 'type': i['InstanceType'], 'tags': {t['Key']: t['Value'] for t in i.get('Tags', [])}} for res in r['Reservations'] for i in res['Instances']]))",
        );
        v.as_array().cloned().unwrap_or_default()
    }

    /// An instance's metadata options as DescribeInstances shows them (`HttpEndpoint`,
    /// `HttpTokens`, ...).
    pub fn metadata_options(&self, instance: &str) -> Value {
        self.ec2(&format!(
            "r = ec2.describe_instances(InstanceIds=[{instance:?}])\n\
             print(json.dumps(r['Reservations'][0]['Instances'][0].get('MetadataOptions')))"
        ))
    }

    /// An instance's attribute (`userData` base64-decoded to bytes as a JSON array of
    /// numbers; others as their value).
    pub fn attribute(&self, instance: &str, attribute: &str) -> Value {
        self.ec2(&format!(
            "r = ec2.describe_instance_attribute(InstanceId={instance:?}, Attribute={attribute:?})\n\
             v = [x for k, x in r.items() if k not in ('InstanceId', 'ResponseMetadata')][0]['Value']\n\
             print(json.dumps(list(base64.b64decode(v)) if {attribute:?} == 'userData' else v))"
        ))
    }
}
