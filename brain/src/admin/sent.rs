//! `brain task prompt`: the request a task's model received at one of its turns, each part
//! under a heading, or the brain's JSON as it is (`--json`).

use serde_json::Value;

use super::client::Target;

/// `brain task prompt TASK [--at STEP | --seq SEQ] [--json]`.
pub async fn show(
    t: &Target,
    task: &str,
    at: Option<u32>,
    seq: Option<u64>,
    json: bool,
) -> anyhow::Result<i32> {
    let req = proto::TaskPromptRequest {
        task_id: task.to_string(),
        step: at.unwrap_or(0),
        seq: seq.unwrap_or(0),
    };
    let text = t.rpc(async |mut c| c.task_prompt(req).await).await?.json;
    if json {
        out!("{text}");
        return Ok(0);
    }
    let v: Value = serde_json::from_str(&text)?;
    out!("{}", heading(&v));
    out!("{}", exactness(&v));
    let req = &v["request"];
    part("system", str_of(&req["system"]));
    if let Some(tools) = req["tools"].as_array().filter(|t| !t.is_empty()) {
        let names: Vec<&str> = tools.iter().map(|t| str_of(&t["name"])).collect();
        part(
            &format!("tools ({}; `--json` for their schemas)", names.len()),
            &names.join(", "),
        );
    }
    for m in req["messages"].as_array().into_iter().flatten() {
        let role = str_of(&m["role"]);
        let title = match str_of(&m["tool_call_id"]) {
            "" => role.to_string(),
            id => format!("{role} (answering {id})"),
        };
        let mut body = str_of(&m["content"]).to_string();
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            if !body.is_empty() {
                body.push('\n');
            }
            body.push_str(&format!(
                "→ {} {} ({})",
                str_of(&c["name"]),
                str_of(&c["arguments"]),
                str_of(&c["id"])
            ));
        }
        part(&title, &body);
    }
    Ok(0)
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Which request this is, of which model, how its tools went.
fn heading(v: &Value) -> String {
    let tools = match str_of(&v["tools"]) {
        "text" => "tools described in the prompt (text tool-call mode)",
        "text_constrained" => {
            "tools described in the prompt, replies constrained to one call (text tool-call mode)"
        }
        _ => "native tool calls",
    };
    format!(
        "task {}: request {} to {} (record {}), {tools}",
        str_of(&v["task"]),
        v["turn"],
        str_of(&v["model"]),
        v["seq"],
    )
}

/// Whether the request shown is the one sent, in words.
fn exactness(v: &Value) -> String {
    let short = |h: &Value| str_of(h).chars().take(12).collect::<String>();
    if v["exact"].as_bool() == Some(true) {
        return format!(
            "exact: rendered again from the log, it has the hash logged when it was sent ({})",
            short(&v["hash"])
        );
    }
    match v["sent_version"].as_u64() {
        None => format!(
            "NOT KNOWN TO BE EXACT: the request was logged without a hash (by an older brain); shown with the words of version {}",
            v["version"]
        ),
        Some(sent) if sent != v["version"].as_u64().unwrap_or(0) => format!(
            "NOT EXACT: sent with the words of version {sent}; shown with those of version {} (this brain's)",
            v["version"]
        ),
        Some(_) => format!(
            "NOT EXACT: the words' version is the same, but the hash logged ({}) is not this rendering's ({}): the task's state was rebuilt differently",
            short(&v["sent_hash"]),
            short(&v["hash"])
        ),
    }
}

/// One part of the request under its heading.
fn part(title: &str, body: &str) {
    out!("\n─── {title}\n{body}");
}
