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
        p.edits.is_empty() && p.malformed == [Unreadable::EditWithoutPath],
        "{p:?}"
    );
    let p = parse_reply("x.py\n<<<<<<< SEARCH\na\n=======\nb\n", 0);
    assert!(
        p.edits.is_empty() && p.malformed == [Unreadable::EditNotEnded],
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
        matches!(&p.malformed[0], Unreadable::Call { block, why: NotACall::NotJson { unclosed: false, .. } } if block.starts_with("{\"tool\": \"ls\"")),
        "{:?}",
        p.malformed[0]
    );
    assert!(p.content.contains("\"tool\": \"ls\""));

    let p = parse_reply("```json\n{\"tool\": \"ls\"}\n```", 0);
    assert!(
        matches!(&p.malformed[0], Unreadable::Call { why: NotACall::NoArguments(n), .. } if n == "ls"),
        "{:?}",
        p.malformed
    );
    let p = parse_reply("```json\n{\"tool\": \"ls\", \"arguments\": [1]}", 0);
    assert!(
        matches!(&p.malformed[0], Unreadable::Call { why: NotACall::ArgumentsNotObject(n), .. } if n == "ls"),
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

/// Two of the wrapper's accommodations are assists the request can turn off: then blocks are
/// not edits and every call of a reply runs. A request that still holds native tools is
/// refused: it must be rendered for the text mode first.
#[tokio::test]
async fn the_wrappers_assists_can_each_be_turned_off() {
    let two_calls = "```json\n{\"tool\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n```\n```json\n{\"tool\": \"finish\", \"arguments\": {}}\n```";
    let block = "a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n";
    let mut req = super::super::tests::fixed_request();
    let wrap = |t: &'static str| TextTools::new(Arc::new(Says(t)), false);
    let refused = wrap(two_calls).complete(&req).await.unwrap_err();
    assert!(refused.to_string().contains("rendered"), "{refused}");
    req.tools.clear();
    req.replies_before = 4;
    // On (the default): one call runs, the block is an edit, numbered by the replies before.
    let r = wrap(two_calls).complete(&req).await.unwrap();
    assert_eq!(r.message.tool_calls.len(), 1);
    assert_eq!(r.message.tool_calls[0].id, "call_4_0");
    assert!(r.calls_not_run.is_some());
    let r = wrap(block).complete(&req).await.unwrap();
    assert_eq!(r.message.tool_calls.len(), 1, "{r:?}");
    assert_eq!(r.message.tool_calls[0].id, "edit_4_0");
    // Off.
    req.text.edit_blocks = false;
    req.text.one_call = false;
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
}
