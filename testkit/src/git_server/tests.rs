//! The git server's credentials and how it reads a CGI answer.

use super::*;

#[test]
fn basic_credentials_are_decoded() {
    // "alice:s3cret:with:colons"
    assert_eq!(
        parse_basic("Basic YWxpY2U6czNjcmV0OndpdGg6Y29sb25z"),
        Some(("alice".into(), "s3cret:with:colons".into()))
    );
    assert_eq!(parse_basic("Bearer abc"), None);
    assert_eq!(parse_basic("Basic !!!"), None);
}

#[test]
fn a_cgi_answer_becomes_a_response() {
    let ok =
        cgi_answer(b"Content-Type: application/x-git\r\nExpires: never\r\n\r\nPACK\r\n\r\nmore")
            .unwrap();
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, b"PACK\r\n\r\nmore");
    assert!(
        ok.headers
            .contains(&("content-type".into(), "application/x-git".into()))
    );
    let refused = cgi_answer(b"Status: 403 Forbidden\nConnection: keep-alive\n\nno").unwrap();
    assert_eq!(refused.status, 403);
    assert_eq!(refused.body, b"no");
    assert!(refused.headers.iter().all(|(k, _)| k != "connection"));
    assert!(cgi_answer(b"Status: lots\r\n\r\n").is_err());
    assert!(cgi_answer(b"no blank line").is_err());
    assert!(cgi_answer(b"no colon here\r\n\r\n").is_err());
}
