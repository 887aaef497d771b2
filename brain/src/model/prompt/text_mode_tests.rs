//! The text tool-call mode's request: the tools in the prompt, earlier calls and results as
//! text, a repeat's temperature, each accommodation an assist that can be off.

use super::*;
use crate::llm::{Message, Role, ToolUse};
use testkit::fake_llm::{FakeLlm, FakeReply};

#[test]
fn a_constrained_request_asks_for_one_call_by_the_tools_schemas() {
    let req = crate::llm::tests::fixed_request();
    let t = render(&req, true);
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
    assert!(render(&req, false).response_schema.is_none());
    let body = crate::llm::openai_body("m", &t);
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
    let mut req = crate::llm::tests::fixed_request();
    req.messages = vec![Message::user("fix it"), reply("the same fix")];
    assert_eq!(render(&req, false).temperature, None, "said once");
    let mut temps = Vec::new();
    for told in ["still fails", "fails again", "and again", "once more"] {
        req.messages.push(Message::user(told));
        req.messages.push(reply("  the same fix\n"));
        temps.push(render(&req, false).temperature);
    }
    assert_eq!(temps, [Some(1.0), Some(1.2), Some(1.4), Some(1.4)]);
    // Something new: the server's default again.
    req.messages.push(reply("another fix"));
    let t = render(&req, false);
    assert_eq!(t.temperature, None);
    let body = crate::llm::openai_body("m", &t);
    assert!(body.get("temperature").is_none(), "{body}");
    req.messages.push(reply("another fix"));
    let t = render(&req, false);
    let body = crate::llm::openai_body("m", &t);
    assert!(
        (body["temperature"].as_f64().unwrap() - 1.0).abs() < 1e-6,
        "{body}"
    );
    let body = crate::llm::anthropic_body("m", &t, 100);
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
    assert_eq!(render(&req, false).temperature, None);
    req.messages.push(code(
        "Now I handle the empty list.",
        "sum(xs)  /  (len(xs) - 1)",
    ));
    assert_eq!(render(&req, false).temperature, Some(1.0));
    req.messages
        .push(code("The bug is the divisor.", "sum(xs) / len(xs)"));
    assert_eq!(render(&req, false).temperature, None);
    let mut hot = t.clone();
    hot.temperature = Some(1.4);
    let body = crate::llm::anthropic_body("m", &hot, 100);
    assert_eq!(body["temperature"], 1.0, "Anthropic takes at most 1.0");
}

#[test]
fn request_conversion() {
    let req = crate::llm::tests::fixed_request();
    let t = render(&req, false);
    assert!(t.tools.is_empty());
    assert!(t.system.starts_with("You are a coding agent.\n\n# Tools"));
    assert!(t.system.contains("## read_file") && t.system.contains(CALL_FORMAT));
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
    let mut req = crate::llm::tests::fixed_request();
    req.messages = vec![
        Message::user("fix it"),
        reply.clone(),
        result("edit_1_0"),
        result("edit_1_1"),
        Message::user("The check still fails."),
    ];
    let t = render(&req, false);
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
    assert_eq!(render(&req, false).temperature, Some(1.0));
    // Edits beside another call: what they did, then the call, without the words.
    let mut mixed = req.messages[1].clone();
    mixed.tool_calls.push(ToolUse {
        id: "call_2_0".into(),
        name: "finish".into(),
        arguments: "{}".into(),
    });
    req.messages = vec![Message::user("fix it"), mixed];
    let t = render(&req, false);
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
    let t = render(&req, false);
    assert_eq!(t.messages.len(), 1);
    assert_eq!(t.messages[0].content, "fix it\n\nYou did not call a tool.");
}

/// The rendering's accommodations are assists: off, the prompt offers no blocks and asks for
/// no single call, the model's replies are shown as it wrote them and a repeat does not
/// raise the temperature.
#[test]
fn the_renderings_assists_can_each_be_turned_off() {
    let mut req = crate::llm::tests::fixed_request();
    let sent = render(&req, false);
    assert!(sent.system.contains("SEARCH") && sent.system.contains("exactly one call"));
    req.text = TextAssists {
        edit_blocks: false,
        one_call: false,
        history_as_calls: false,
        repeat_temperature: false,
    };
    let sent = render(&req, false);
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
    let sent = render(&req, false);
    assert_eq!(sent.replies_before, 2);
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
    assert_eq!(render(&req, false).temperature, Some(1.0));
}

#[tokio::test]
async fn text_tool_mode_end_to_end() {
    let llm = FakeLlm::start(|r| {
        if r.assistant_turns() == 0 {
            FakeReply::text(
                "Reading.\n```json\n{\"tool\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n```",
            )
        } else {
            FakeReply::text(format!(
                "got: {}",
                r.last_tool_result_text().unwrap_or_default()
            ))
        }
    });
    let mut c = crate::llm::tests::cfg("ollama", &llm.url());
    c.models.insert(
        "ollama:qwen".into(),
        crate::llm::ModelConfig {
            tool_mode: Some(crate::llm::ToolMode::Text),
            ..Default::default()
        },
    );
    let p = crate::llm::connect(
        &crate::llm::ModelSpec::parse("ollama:qwen").unwrap(),
        &c,
        &Default::default(),
    )
    .unwrap();
    let mut req = crate::llm::tests::simple_request();
    let r = p.complete(&as_sent(&req, p.tools_sent())).await.unwrap();
    assert_eq!(r.message.content, "Reading.");
    assert_eq!(r.message.tool_calls[0].id, "call_0_0");
    assert_eq!(r.message.tool_calls[0].arguments, r#"{"path":"a"}"#);
    req.messages.push(r.message.clone());
    req.messages.push(Message::tool("call_0_0", "abc"));
    let r = p.complete(&as_sent(&req, p.tools_sent())).await.unwrap();
    assert_eq!(
        r.message.content,
        "got: Result of read_file call call_0_0:\nabc"
    );
    let body = &llm.requests()[1].body;
    assert!(body.get("tools").is_none());
    assert!(
        body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("# Tools")
    );
}

#[tokio::test]
async fn a_constrained_text_model_sends_the_schema_and_its_bare_json_reply_is_a_call() {
    let llm = FakeLlm::start(|_| {
        FakeReply::text(r#"{"tool": "read_file", "arguments": {"path": "a.py"}}"#)
    });
    let mut c = crate::llm::tests::cfg("openai", &llm.url());
    c.models.insert(
        "openai:small".into(),
        crate::llm::ModelConfig {
            tool_mode: Some(crate::llm::ToolMode::Text),
            constrain: Some(crate::llm::Constrain::JsonSchema),
            ..Default::default()
        },
    );
    let p = crate::llm::connect(
        &crate::llm::ModelSpec::parse("openai:small").unwrap(),
        &c,
        &Default::default(),
    )
    .unwrap();
    let r = p
        .complete(&as_sent(
            &crate::llm::tests::simple_request(),
            p.tools_sent(),
        ))
        .await
        .unwrap();
    assert_eq!(r.message.tool_calls.len(), 1, "{r:?}");
    assert_eq!(r.message.tool_calls[0].name, "read_file");
    let sent = &llm.requests()[0].body;
    assert!(sent.get("tools").is_none(), "{sent}");
    assert_eq!(sent["response_format"]["type"], "json_schema");
    let branches = sent["response_format"]["json_schema"]["schema"]["anyOf"]
        .as_array()
        .unwrap();
    assert_eq!(
        branches.len(),
        crate::llm::tests::simple_request().tools.len()
    );
}

/// What a model is told of a block that could not be read says why and shows the format.
#[test]
fn an_unreadable_block_is_told_why_with_the_format() {
    let p = crate::llm::parse_reply(
        "```json\n{\"tool\": \"ls\", \"arguments\": {\"path\": \".\"\n",
        0,
    );
    let told = unreadable(&p.malformed[0]);
    assert!(
        told.contains("not valid JSON") && told.contains("not closed"),
        "{told}"
    );
    assert!(
        told.contains(CALL_FORMAT) && told.contains("\"tool\": \"ls\""),
        "{told}"
    );
    let p = crate::llm::parse_reply("```json\n{\"tool\": \"ls\"}\n```", 0);
    assert!(unreadable(&p.malformed[0]).contains("no \"arguments\""));
    let p = crate::llm::parse_reply("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", 0);
    assert!(unreadable(&p.malformed[0]).contains("no file is named"));
}
