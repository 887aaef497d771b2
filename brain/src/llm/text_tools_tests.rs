//! The text tool-call mode's tests: parsing calls, SEARCH/REPLACE and code blocks, requests.

use super::*;

#[test]
fn search_replace_blocks_are_edits_of_the_file_named_above_them() {
    let text = "The divisor is off by one.\n\nstats.py\n```python\n<<<<<<< SEARCH\n    return total / (len(xs) + 1)\n=======\n    return total / len(xs)\n>>>>>>> REPLACE\n```\n\n<<<<<<< SEARCH\ndef spread(xs):\n=======\ndef spread(xs):  # max - min\n>>>>>>> REPLACE\n\n**src/new.py**\n<<<<<<< SEARCH\n=======\nX = 1\n>>>>>>> REPLACE\n";
    let p = parse_reply(text, 3);
    assert!(p.calls.is_empty() && p.malformed.is_empty(), "{p:?}");
    let edits: Vec<(String, Value)> = p
        .edits
        .iter()
        .map(|e| (e.id.clone(), serde_json::from_str(&e.arguments).unwrap()))
        .collect();
    assert_eq!(edits.len(), 2, "{edits:?}");
    assert_eq!(edits[0].0, "edit_3_0");
    assert_eq!(
        edits[0].1,
        json!({"path": "stats.py", "old_string": "    return total / (len(xs) + 1)", "new_string": "    return total / len(xs)"})
    );
    assert_eq!(
        edits[1].1["path"], "stats.py",
        "the path carries over to the next block"
    );
    // An empty SEARCH is a new file's text: a block of code for the agent to place.
    let new_file: Vec<&CodeBlock> = p
        .code_blocks
        .iter()
        .filter(|b| b.path.as_deref() == Some("src/new.py"))
        .collect();
    assert_eq!(new_file.len(), 1, "{:?}", p.code_blocks);
    assert_eq!(new_file[0].body, "X = 1\n");
    // No path anywhere, or no end: not applied, and said why.
    let p = parse_reply("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", 0);
    assert!(
        p.edits.is_empty() && p.malformed[0].contains("no file is named"),
        "{p:?}"
    );
    let p = parse_reply("x.py\n<<<<<<< SEARCH\na\n=======\nb\n", 0);
    assert!(
        p.edits.is_empty() && p.malformed[0].contains(">>>>>>> REPLACE"),
        "{p:?}"
    );
}

#[test]
fn code_blocks_name_their_file_in_the_info_string_or_the_line_above() {
    let text = "In `stats.py`:\n```python\ndef mean(xs):\n    return 1\n```\nand\n```python util/helpers.py\nX = 1\n```\n```js\nlet a = 1;\n```\n```sh\npython3 test.py\n```";
    let p = parse_reply(text, 0);
    let got: Vec<(Option<&str>, &str)> = p
        .code_blocks
        .iter()
        .map(|b| (b.path.as_deref(), b.lang.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Some("stats.py"), "python"),
            (Some("util/helpers.py"), "python"),
            (None, "js"),
            (None, "sh")
        ]
    );
    assert_eq!(p.code_blocks[0].body, "def mean(xs):\n    return 1\n");
    // A call is a call, not a block of code; numbers and absolute paths are not files.
    let p = parse_reply("```json\n{\"tool\": \"ls\", \"arguments\": {}}\n```", 0);
    assert!(p.code_blocks.is_empty());
    assert_eq!(path_in("version 1.5 of /etc/passwd"), None);
    assert_eq!(path_in("**src/lib.rs**:"), Some("src/lib.rs".into()));
}

#[test]
fn a_constrained_request_asks_for_one_call_by_the_tools_schemas() {
    let req = super::super::tests::fixed_request();
    let t = to_text_request(&req, true);
    let schema = t.response_schema.clone().expect("a schema");
    let branches = schema["anyOf"].as_array().unwrap();
    assert_eq!(branches.len(), req.tools.len());
    assert_eq!(branches[0]["properties"]["tool"]["const"], "read_file");
    assert_eq!(
        branches[0]["properties"]["arguments"],
        req.tools[0].parameters
    );
    assert!(
        !t.system.contains("<<<<<<< SEARCH"),
        "no text edits when constrained"
    );
    assert!(to_text_request(&req, false).response_schema.is_none());
    let body = super::super::openai::build_body("m", &t, "max_tokens", 100);
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
}

#[test]
fn a_reply_given_before_word_for_word_is_asked_again_with_more_randomness() {
    let reply = |t: &str| Message {
        role: Role::Assistant,
        content: t.into(),
        tool_calls: vec![],
        tool_call_id: String::new(),
    };
    let mut req = super::super::tests::fixed_request();
    req.messages = vec![Message::user("fix it"), reply("the same fix")];
    assert_eq!(to_text_request(&req, false).temperature, None, "said once");
    let mut temps = Vec::new();
    for told in ["still fails", "fails again", "and again", "once more"] {
        req.messages.push(Message::user(told));
        req.messages.push(reply("  the same fix\n"));
        temps.push(to_text_request(&req, false).temperature);
    }
    assert_eq!(temps, [Some(1.0), Some(1.2), Some(1.4), Some(1.4)]);
    // Something new: the server's default again.
    req.messages.push(reply("another fix"));
    let t = to_text_request(&req, false);
    assert_eq!(t.temperature, None);
    let body = super::super::openai::build_body("m", &t, "max_tokens", 100);
    assert!(body.get("temperature").is_none(), "{body}");
    req.messages.push(reply("another fix"));
    let t = to_text_request(&req, false);
    let body = super::super::openai::build_body("m", &t, "max_tokens", 100);
    assert!(
        (body["temperature"].as_f64().unwrap() - 1.0).abs() < 1e-6,
        "{body}"
    );
    let body = super::super::anthropic::build_body("m", &t, 100);
    assert!(
        (body["temperature"].as_f64().unwrap() - 1.0).abs() < 1e-6,
        "{body}"
    );
    // The same code in other words is the same reply; other code is not.
    let code = |words: &str, fix: &str| {
        reply(&format!(
            "{words}\n```python stats.py\ndef mean(xs):\n    return {fix}\n```\nDone."
        ))
    };
    req.messages
        .push(code("The bug is the divisor.", "sum(xs) / (len(xs) - 1)"));
    assert_eq!(to_text_request(&req, false).temperature, None);
    req.messages.push(code(
        "Now I handle the empty list.",
        "sum(xs)  /  (len(xs) - 1)",
    ));
    assert_eq!(to_text_request(&req, false).temperature, Some(1.0));
    req.messages
        .push(code("The bug is the divisor.", "sum(xs) / len(xs)"));
    assert_eq!(to_text_request(&req, false).temperature, None);
    let mut hot = t.clone();
    hot.temperature = Some(1.4);
    let body = super::super::anthropic::build_body("m", &hot, 100);
    assert_eq!(body["temperature"], 1.0, "Anthropic takes at most 1.0");
}

#[test]
fn one_good_block() {
    let p = parse_reply(
        "I will list the files.\n```json\n{\"tool\": \"ls\", \"arguments\": {\"path\": \".\"}}\n```\n",
        2,
    );
    assert_eq!(p.content, "I will list the files.");
    assert_eq!(
        p.calls,
        vec![ToolUse {
            id: "call_2_0".into(),
            name: "ls".into(),
            arguments: r#"{"path":"."}"#.into()
        }]
    );
    assert!(p.malformed.is_empty());
}

#[test]
fn two_blocks_and_variants() {
    let text = "First:\n```tool\n{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\n```\nthen\n```\n{\"tool\": \"read\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}\n```\nand\n```json {\"tool\": \"ls\", \"arguments\": {}}```";
    let p = parse_reply(text, 0);
    let names: Vec<_> = p
        .calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("call_0_0", "read"),
            ("call_0_1", "read"),
            ("call_0_2", "ls")
        ]
    );
    assert_eq!(p.calls[1].arguments, r#"{"path": "b"}"#);
    assert_eq!(p.content, "First:\nthen\nand");
    assert!(p.malformed.is_empty(), "{:?}", p.malformed);
}

#[test]
fn malformed_block() {
    let p = parse_reply(
        "```json\n{\"tool\": \"ls\", \"arguments\": {\"path\": \".\"\n```\n",
        0,
    );
    assert!(p.calls.is_empty());
    assert_eq!(p.malformed.len(), 1);
    assert!(
        p.malformed[0].contains("not valid JSON"),
        "{}",
        p.malformed[0]
    );
    assert!(p.malformed[0].contains(FORMAT));
    assert!(p.content.contains("\"tool\": \"ls\""));

    let p = parse_reply("```json\n{\"tool\": \"ls\"}\n```", 0);
    assert!(
        p.malformed[0].contains("no \"arguments\""),
        "{:?}",
        p.malformed
    );
    let p = parse_reply("```json\n{\"tool\": \"ls\", \"arguments\": [1]}", 0);
    assert!(
        p.malformed[0].contains("not a JSON object"),
        "{:?}",
        p.malformed
    );
}

#[test]
fn prose_and_other_code() {
    let text =
        "Done. Here is the config:\n```json\n{\"port\": 8080}\n```\n```rust\nfn main() {}\n```";
    let p = parse_reply(text, 1);
    assert_eq!(p.content, text);
    assert!(p.calls.is_empty() && p.malformed.is_empty());
    let p = parse_reply("All done, no tools needed.", 0);
    assert_eq!(p.content, "All done, no tools needed.");
}

#[test]
fn request_conversion() {
    let req = super::super::tests::fixed_request();
    let t = to_text_request(&req, false);
    assert!(t.tools.is_empty());
    assert!(t.system.starts_with("You are a coding agent.\n\n# Tools"));
    assert!(t.system.contains("## read_file") && t.system.contains(FORMAT));
    let roles: Vec<_> = t.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
    // A reply that made a call is shown as the call: its words are not there to copy.
    assert_eq!(
        t.messages[1].content,
        "```json\n{\"tool\": \"read_file\", \"arguments\": {\"path\":\"src/main.rs\"}}\n```"
    );
    assert!(t.messages[1].tool_calls.is_empty());
    assert_eq!(
        t.messages[2].content,
        "Result of read_file call call_1:\nfn main() {}"
    );
}

#[test]
fn a_reply_that_made_calls_is_shown_as_its_calls_and_its_block_edits_as_what_they_did() {
    let edit = |id: &str, path: &str| ToolUse {
        id: id.into(),
        name: "write_file".into(),
        arguments: serde_json::json!({"path": path, "content": "x = 1\n"}).to_string(),
    };
    let reply = Message {
        role: Role::Assistant,
        content: "Here is the fix:\n```python\nx = 1\n```".into(),
        tool_calls: vec![edit("edit_1_0", "a.py"), edit("edit_1_1", "b/c.py")],
        tool_call_id: String::new(),
    };
    let result = |id: &str| Message {
        role: Role::Tool,
        content: "wrote 6 bytes".into(),
        tool_calls: vec![],
        tool_call_id: id.into(),
    };
    let mut req = super::super::tests::fixed_request();
    req.messages = vec![
        Message::user("fix it"),
        reply.clone(),
        result("edit_1_0"),
        result("edit_1_1"),
        Message::user("The check still fails."),
    ];
    let t = to_text_request(&req, false);
    assert_eq!(t.messages.len(), 1, "{:?}", t.messages);
    let text = &t.messages[0].content;
    assert!(
        text.starts_with("fix it\n\n(You changed a.py, b/c.py with blocks of code.)\n\nResult of write_file call edit_1_0:\nwrote 6 bytes"),
        "{text}"
    );
    assert!(text.ends_with("The check still fails."), "{text}");
    assert!(
        !text.contains("Here is the fix"),
        "its own words are not shown: {text}"
    );
    // The same reply again is still seen as a repeat (the temperature goes up).
    req.messages.push(reply);
    assert_eq!(to_text_request(&req, false).temperature, Some(1.0));
    // Edits beside another call: what they did, then the call, without the words.
    let mut mixed = req.messages[1].clone();
    mixed.tool_calls.push(ToolUse {
        id: "call_2_0".into(),
        name: "finish".into(),
        arguments: "{}".into(),
    });
    req.messages = vec![Message::user("fix it"), mixed];
    let t = to_text_request(&req, false);
    assert_eq!(
        t.messages[0].content,
        "fix it\n\n(You changed a.py, b/c.py with blocks of code.)"
    );
    assert_eq!(t.messages[1].role, Role::Assistant);
    assert_eq!(
        t.messages[1].content,
        "```json\n{\"tool\": \"finish\", \"arguments\": {}}\n```"
    );
    // A reply without calls is not shown: what it is told next says what became of it.
    req.messages = vec![
        Message::user("fix it"),
        Message {
            role: Role::Assistant,
            content: "I think the bug is in a.py.".into(),
            tool_calls: vec![],
            tool_call_id: String::new(),
        },
    ];
    req.messages.push(Message::user("You did not call a tool."));
    let t = to_text_request(&req, false);
    assert_eq!(t.messages.len(), 1);
    assert_eq!(t.messages[0].content, "fix it\n\nYou did not call a tool.");
}

#[test]
fn what_a_reply_makes_up_in_the_results_voice_is_cut_off() {
    // What a 1.5B model wrote after its own edit: a result of its own, and a verdict.
    let text = "The lines are not needed.\n```json\n{\"tool\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n```\nResult of edit_file call edit_0_1:\nedited bounds.py\n```json\n{\"tool\": \"finish\", \"arguments\": {}}\n```";
    let p = parse_reply(text, 2);
    assert_eq!(p.calls.len(), 1, "{p:?}");
    assert_eq!(p.calls[0].name, "read_file");
    assert!(!p.content.contains("Result of"), "{}", p.content);
    // Inside a block it is the block's text.
    let text = "```python a.py\nprint(\"x\")\nResult of x\n```\n";
    let p = parse_reply(text, 0);
    assert_eq!(p.code_blocks.len(), 1);
    assert!(p.code_blocks[0].body.contains("Result of x"));
}

#[test]
fn a_backslash_json_does_not_escape_is_taken_as_itself() {
    // The regex a small model wrote, with `\(` left as it is in the regex: JSON has no such
    // escape, and the call means `def greet\(`.
    let text = "```json\n{\"tool\": \"search\", \"arguments\": {\"glob\":\"greet.py\",\"pattern\":\"def greet\\(\"}}\n```";
    let p = parse_reply(text, 0);
    assert!(p.malformed.is_empty(), "{p:?}");
    assert_eq!(p.calls.len(), 1, "{p:?}");
    let args: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
    assert_eq!(args["pattern"], "def greet\\(");
    // Valid escapes keep their meaning; a backslash outside strings is not touched.
    assert_eq!(
        repair_escapes(r#"{"a": "x\"y\\z\n\u00e9 C:\dir \d+", "b": 1}"#),
        r#"{"a": "x\"y\\z\n\u00e9 C:\\dir \\d+", "b": 1}"#
    );
    assert_eq!(repair_escapes(r#"{"u": "\uZZ"}"#), r#"{"u": "\\uZZ"}"#);
    // Still not JSON after that: malformed, and said so.
    let p = parse_reply(
        "```json\n{\"tool\": \"search\", \"arguments\": {\"pattern\": }}\n```",
        0,
    );
    assert_eq!(p.malformed.len(), 1, "{p:?}");
}

/// A model that always says `text`.
struct Says(&'static str);

#[async_trait::async_trait]
impl Provider for Says {
    async fn complete(&self, _: &Request) -> Result<Response, Error> {
        Ok(Response::new(self.0, vec![], Default::default()))
    }
}

/// Each of the wrapper's accommodations is an assist the request can turn off: then blocks
/// are not edits (and the prompt does not offer them), every call of a reply runs, the
/// model's replies are shown as it wrote them and a repeat does not raise the temperature.
#[tokio::test]
async fn the_wrappers_assists_can_each_be_turned_off() {
    let off = TextAssists {
        edit_blocks: false,
        one_call: false,
        history_as_calls: false,
        repeat_temperature: false,
    };
    let two_calls = "```json\n{\"tool\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n```\n```json\n{\"tool\": \"finish\", \"arguments\": {}}\n```";
    let block = "a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n";
    let mut req = super::super::tests::fixed_request();
    let wrap = |t: &'static str| TextTools::new(Arc::new(Says(t)), false);
    // On (the default): one call runs, the block is an edit.
    let r = wrap(two_calls).complete(&req).await.unwrap();
    assert_eq!(r.message.tool_calls.len(), 1);
    assert!(r.calls_not_run.is_some());
    let r = wrap(block).complete(&req).await.unwrap();
    assert_eq!(r.message.tool_calls.len(), 1, "{r:?}");
    assert!(r.message.tool_calls[0].id.starts_with(EDIT_ID));
    let sent = to_text_request(&req, false);
    assert!(sent.system.contains("SEARCH") && sent.system.contains("exactly one call"));
    // Off.
    req.text = off;
    let r = wrap(two_calls).complete(&req).await.unwrap();
    let names: Vec<&str> = r
        .message
        .tool_calls
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["read_file", "finish"]);
    assert!(r.calls_not_run.is_none());
    let r = wrap(block).complete(&req).await.unwrap();
    assert!(
        r.message.tool_calls.is_empty() && r.code_blocks.is_empty(),
        "{r:?}"
    );
    assert!(r.no_call, "a block that is not read is no call");
    let sent = to_text_request(&req, false);
    assert!(!sent.system.contains("SEARCH") && !sent.system.contains("exactly one call"));
    assert!(
        sent.system.contains("# Tools"),
        "the tools are still described"
    );
    let said = Message {
        role: Role::Assistant,
        content: "I will look first.".into(),
        tool_calls: vec![ToolUse {
            id: "call_1_0".into(),
            name: "read_file".into(),
            arguments: "{\"path\":\"a.py\"}".into(),
        }],
        tool_call_id: String::new(),
    };
    req.messages = vec![
        Message::user("fix it"),
        said.clone(),
        Message::tool("call_1_0", "x = 1"),
        said,
    ];
    let sent = to_text_request(&req, false);
    assert_eq!(sent.messages[1].role, Role::Assistant);
    assert!(
        sent.messages[1]
            .content
            .starts_with("I will look first.\n\n```json\n{\"tool\": \"read_file\""),
        "{}",
        sent.messages[1].content
    );
    assert_eq!(sent.temperature, None, "a repeat keeps the temperature");
    req.text = TextAssists::default();
    assert_eq!(to_text_request(&req, false).temperature, Some(1.0));
}
