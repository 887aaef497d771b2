//! Tests of placing the blocks of code a model writes as edits.
use super::*;

const STATS: &str = "import math\n\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / (len(xs) + 1)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n";

fn block(path: Option<&str>, lang: &str, body: &str) -> CodeBlock {
    CodeBlock {
        path: path.map(String::from),
        lang: lang.into(),
        body: body.into(),
    }
}

fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn none(_: &str) -> bool {
    false
}

/// Applies the calls to the files as the tools would.
fn apply(calls: &[(String, String)], texts: &mut BTreeMap<String, String>) {
    for (name, args) in calls {
        let a: serde_json::Value = serde_json::from_str(args).unwrap();
        let p = a["path"].as_str().unwrap().to_string();
        if name == "write_file" {
            texts.insert(p, a["content"].as_str().unwrap().into());
        } else {
            let t = texts.get(&p).unwrap().clone();
            let new = crate::model::tools::apply_edit(
                &t,
                a["old_string"].as_str().unwrap(),
                a["new_string"].as_str().unwrap(),
                &p,
            )
            .unwrap();
            texts.insert(p, new);
        }
    }
}

#[test]
fn a_block_beginning_with_one_definitions_first_line_replaces_that_definition() {
    let mut t = files(&[
        ("stats.py", STATS),
        ("test_stats.py", "def test_mean():\n    pass\n"),
    ]);
    let b = block(
        None,
        "python",
        "def mean(xs):\n    if not xs:\n        return 0\n    return sum(xs) / len(xs)\n",
    );
    let Resolved::Calls(calls, what) = resolve(&b, &t, &|p| p.starts_with("test_")) else {
        panic!("resolved")
    };
    assert_eq!(what, "definitions in stats.py");
    apply(&calls, &mut t);
    assert_eq!(
        t["stats.py"],
        "import math\n\n\ndef mean(xs):\n    if not xs:\n        return 0\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n"
    );
}

#[test]
fn a_method_written_at_column_zero_is_indented_to_its_place_and_braces_close() {
    let class = "class Stats:\n    def mean(self, xs):\n        return 0\n\n    def n(self):\n        return 1\n";
    let mut t = files(&[("s.py", class)]);
    let b = block(
        None,
        "",
        "def mean(self, xs):\n    return sum(xs) / len(xs)",
    );
    let Resolved::Calls(calls, _) = resolve(&b, &t, &none) else {
        panic!()
    };
    apply(&calls, &mut t);
    assert_eq!(
        t["s.py"],
        "class Stats:\n    def mean(self, xs):\n        return sum(xs) / len(xs)\n\n    def n(self):\n        return 1\n"
    );

    let js = "function slug(s) {\n  return s.replace(/ /, '-');\n}\n\nmodule.exports = { slug };\n";
    let mut t = files(&[("slug.js", js)]);
    let b = block(
        None,
        "javascript",
        "function slug(s) {\n  return s.toLowerCase().replace(/ /g, '-');\n}\n",
    );
    let Resolved::Calls(calls, _) = resolve(&b, &t, &none) else {
        panic!()
    };
    apply(&calls, &mut t);
    assert_eq!(
        t["slug.js"],
        "function slug(s) {\n  return s.toLowerCase().replace(/ /g, '-');\n}\n\nmodule.exports = { slug };\n"
    );
}

#[test]
fn a_named_file_is_written_whole_when_the_block_is_the_whole_file() {
    let t = files(&[("stats.py", STATS)]);
    let whole = "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n";
    let Resolved::Calls(calls, what) =
        resolve(&block(Some("stats.py"), "python", whole), &t, &none)
    else {
        panic!()
    };
    assert_eq!(what, "the whole of stats.py");
    assert_eq!(calls[0].0, "write_file");
    // A new file is written whole.
    let Resolved::Calls(calls, _) = resolve(&block(Some("util.py"), "python", "X = 1"), &t, &none)
    else {
        panic!()
    };
    assert_eq!(
        calls,
        vec![(
            "write_file".into(),
            json!({"path": "util.py", "content": "X = 1\n"}).to_string()
        )]
    );
    // A named file with one definition in the block: that definition only.
    let mut t2 = t.clone();
    let Resolved::Calls(calls, _) = resolve(
        &block(
            Some("stats.py"),
            "python",
            "def spread(xs):\n    return max(xs) - min(xs) if xs else 0\n",
        ),
        &t2,
        &none,
    ) else {
        panic!()
    };
    apply(&calls, &mut t2);
    assert!(t2["stats.py"].starts_with("import math\n\n\ndef mean(xs):\n    total = 0"));
    assert!(
        t2["stats.py"].ends_with("def spread(xs):\n    return max(xs) - min(xs) if xs else 0\n")
    );
}

#[test]
fn ambiguous_or_foreign_blocks_are_not_applied_and_say_why_in_one_line() {
    let t = files(&[
        ("a.py", "def f():\n    return 1\n"),
        ("b.py", "def f():\n    return 2\n"),
    ]);
    let r = resolve(
        &block(None, "python", "def f():\n    return 3\n"),
        &t,
        &none,
    );
    let Resolved::NotApplied(why) = r else {
        panic!("{r:?}")
    };
    assert!(why.contains("several files (a.py, b.py)"), "{why}");
    assert!(!why.contains('\n'));
    let r = resolve(
        &block(None, "python", "def g():\n    return 3\n"),
        &t,
        &none,
    );
    let Resolved::NotApplied(why) = r else {
        panic!("{r:?}")
    };
    assert!(
        why.contains("no definition begins with `def g():`"),
        "{why}"
    );
    // A fragment that is not a definition's first line is not spliced in.
    let t = files(&[("m.py", STATS)]);
    let r = resolve(
        &block(None, "python", "    total = 0\n    total = 1\n"),
        &t,
        &none,
    );
    assert!(
        matches!(r, Resolved::NotApplied(ref w) if w.contains("not the first line of a definition")),
        "{r:?}"
    );
    // Commands and output are not edits; the same code again changes nothing.
    assert_eq!(
        resolve(&block(None, "sh", "python3 test.py"), &t, &none),
        Resolved::NotAnEdit
    );
    let same = "def spread(xs):\n    return max(xs) - min(xs)\n";
    let r = resolve(&block(None, "python", same), &t, &none);
    assert!(
        matches!(r, Resolved::NotApplied(ref w) if w.contains("already holds")),
        "{r:?}"
    );
    // A protected file is never written, named or not, and the model is told why.
    let t = files(&[("test_m.py", "def test():\n    assert False\n")]);
    for path in [Some("test_m.py"), None] {
        let r = resolve(
            &block(path, "python", "def test():\n    pass\n"),
            &t,
            &|p| p.starts_with("test_"),
        );
        assert!(
            matches!(r, Resolved::NotApplied(ref w) if w.contains("test_m.py, which the acceptance check relies on")),
            "{r:?}"
        );
    }
}

#[test]
fn an_unnamed_block_that_is_the_whole_of_one_file_in_view_rewrites_it() {
    let cart = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\n\ndef total(lines):\n    return 1\n";
    let t = files(&[
        ("cart.py", cart),
        ("pricing.py", "def discount(s):\n    return 0\n"),
    ]);
    let body = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\n\ndef total(lines):\n    return 2\n";
    let r = resolve(&block(None, "python", body), &t, &none);
    let Resolved::Calls(calls, what) = r else {
        panic!("{r:?}")
    };
    // The lines it only copied are left as they are: the change is the definition's.
    assert_eq!(what, "definitions in cart.py");
    let mut t = t;
    apply(&calls, &mut t);
    assert_eq!(t["cart.py"], body);
    // A rewrite that moves things about is written whole.
    let moved = "\"\"\"A cart.\"\"\"\n\nfrom pricing import discount\n\nTAX = 0\n\n\ndef total(lines):\n    return 2 + TAX\n";
    let r = resolve(&block(None, "python", moved), &t, &none);
    let Resolved::Calls(calls, what) = r else {
        panic!("{r:?}")
    };
    assert_eq!(what, "the whole of cart.py");
    assert_eq!(calls[0].0, "write_file");
}

#[test]
fn a_whole_file_that_also_looks_like_another_is_the_one_it_begins_like() {
    // From a real 1.5B run: cart.py rewritten with pricing's constants moved in, so it
    // holds most of pricing.py's top lines too; its first line says which it is.
    let cart = "\"\"\"A cart of (price, quantity) lines.\"\"\"\n\nfrom pricing import discount\n\n\ndef subtotal(lines):\n    return sum(p * q for p, q in lines)\n\n\ndef total(lines):\n    s = subtotal(lines)\n    return round(s - discount(s), 2)\n\n\ndef discount(subtotal):\n    return 0\n";
    let pricing = "\"\"\"Discount rules.\"\"\"\n\nTHRESHOLD = 100\nRATE = 0.10\n\n\ndef discount(subtotal):\n    if subtotal > THRESHOLD:\n        return round(subtotal * RATE, 2)\n    return 0\n";
    let t = files(&[("cart.py", cart), ("pricing.py", pricing)]);
    let body = "\"\"\"A cart of (price, quantity) lines.\"\"\"\n\nTHRESHOLD = 100\nRATE = 0.10\n\n\ndef subtotal(lines):\n    return sum(p * q for p, q in lines)\n\n\ndef total(lines):\n    s = subtotal(lines)\n    return round(s - discount(s), 2)\n\n\ndef discount(subtotal):\n    if subtotal > THRESHOLD:\n        return round(subtotal * RATE, 2)\n    return 0\n";
    let r = resolve(&block(None, "python", body), &t, &none);
    let Resolved::Calls(calls, what) = r else {
        panic!("{r:?}")
    };
    assert_eq!(what, "the whole of cart.py");
    assert_eq!(calls[0].0, "write_file");
}

#[test]
fn a_block_that_begins_like_the_file_and_changes_a_definition_line_is_the_whole_file() {
    // From a real 1.5B run: the fix changes the one definition's first line, so only
    // half the file's top lines are in the block, but it begins with the file's docstring.
    let greet = "\"\"\"Greetings.\"\"\"\n\n\ndef greet(name, greeting=\"Hi\"):\n    return f\"{greeting}, {name}!\"\n";
    let fixed = "\"\"\"Greetings.\"\"\"\n\ndef greet(name, greeting=\"Hello\"):\n    return f\"{greeting}, {name}!\"\n";
    let t = files(&[("greet.py", greet)]);
    for path in [Some("greet.py"), None] {
        let r = resolve(&block(path, "python", fixed), &t, &none);
        let Resolved::Calls(calls, what) = r else {
            panic!("{r:?}")
        };
        assert_eq!(what, "the whole of greet.py");
        assert_eq!(calls[0].0, "write_file");
    }
    // The imports and one of two definitions are not the whole file (the other would be
    // lost): that definition is replaced.
    let t = files(&[("stats.py", STATS)]);
    let part = "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n";
    for path in [Some("stats.py"), None] {
        let r = resolve(&block(path, "python", part), &t, &none);
        assert!(
            matches!(r, Resolved::Calls(ref c, _) if c.iter().all(|c| c.0 == "edit_file")),
            "{r:?}"
        );
    }
}

#[test]
fn two_definitions_in_one_block_replace_theirs() {
    let mut t = files(&[("stats.py", STATS)]);
    let b = "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return 0\n";
    let Resolved::Calls(calls, _) = resolve(&block(None, "python", b), &t, &none) else {
        panic!()
    };
    assert_eq!(calls.len(), 2);
    apply(&calls, &mut t);
    assert_eq!(
        t["stats.py"],
        "import math\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return 0\n"
    );
}

#[test]
fn a_block_that_changes_nothing_is_not_applied_and_says_so() {
    let t = files(&[("stats.py", STATS)]);
    // The file as it is, named or not, with blank lines and trailing spaces changed.
    let same = STATS.replace("\n\n\n", "\n\n").replace("(xs):", "(xs):  ");
    for named in [Some("stats.py"), None] {
        let r = resolve(&block(named, "python", &same), &t, &none);
        assert_eq!(r, Resolved::Unchanged("stats.py".into()), "{named:?}");
    }
    // One changed line is a change.
    let changed = STATS.replace("(len(xs) + 1)", "len(xs)");
    assert!(matches!(
        resolve(&block(Some("stats.py"), "python", &changed), &t, &none),
        Resolved::Calls(..)
    ));
}

#[test]
fn lines_after_the_definition_that_the_file_holds_are_not_added_again() {
    // What a 1.5B model wrote for a Node module: the function, fixed, and the export.
    let slug = "\"use strict\";\n\nfunction slug(title) {\n  return title.toLowerCase().replace(/ +/, \"-\");\n}\n\nmodule.exports = { slug };\n";
    let mut t = files(&[("slug.js", slug)]);
    let fixed = "function slug(title) {\n  return title.trim().toLowerCase().replace(/ +/g, \"-\");\n}\n\nmodule.exports = { slug };\n";
    let Resolved::Calls(calls, _) = resolve(&block(None, "javascript", fixed), &t, &none) else {
        panic!()
    };
    apply(&calls, &mut t);
    assert_eq!(
        t["slug.js"],
        "\"use strict\";\n\nfunction slug(title) {\n  return title.trim().toLowerCase().replace(/ +/g, \"-\");\n}\n\nmodule.exports = { slug };\n"
    );
}

#[test]
fn a_first_line_that_only_names_the_file_is_not_written_into_it() {
    let texts = files(&[
        ("stats.py", STATS),
        ("web/slug.js", "function slug(s) {\n  return s;\n}\n"),
    ]);
    for first in [
        "# stats.py",
        "# stats.py (the whole file)",
        "`stats.py` (the whole file):",
    ] {
        let body = format!("{first}\n{}", STATS.replace("(len(xs) + 1)", "len(xs)"));
        let Resolved::Calls(calls, _) =
            resolve(&block(Some("stats.py"), "python", &body), &texts, &none)
        else {
            panic!("{first}: not applied");
        };
        let mut t = texts.clone();
        apply(&calls, &mut t);
        assert_eq!(
            t["stats.py"],
            STATS.replace("(len(xs) + 1)", "len(xs)"),
            "{first}"
        );
    }
    let js = "// slug.js\nfunction slug(s) {\n  return s.toLowerCase();\n}\n";
    let Resolved::Calls(calls, _) = resolve(&block(None, "javascript", js), &texts, &none) else {
        panic!("not applied");
    };
    let mut t = texts.clone();
    apply(&calls, &mut t);
    assert!(
        t["web/slug.js"].starts_with("function slug(s) {\n  return s.toLowerCase();"),
        "{}",
        t["web/slug.js"]
    );
    // A file that begins with such a line keeps it; other comments stay.
    let headed = files(&[("a.py", "# a.py\nX = 1\n")]);
    let Resolved::Calls(calls, _) = resolve(
        &block(Some("a.py"), "python", "# a.py\nX = 2\n"),
        &headed,
        &none,
    ) else {
        panic!("not applied");
    };
    let mut t = headed.clone();
    apply(&calls, &mut t);
    assert_eq!(t["a.py"], "# a.py\nX = 2\n");
    assert!(!names_a_file("# the mean of a list", &["stats.py"]));
}
