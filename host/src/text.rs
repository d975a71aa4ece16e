//! Small text helpers shared across the host: URLs without passwords, this
//! machine's name, and UTF-8-safe truncation.

/// A URL with its password replaced by `***`, for error messages, logs and
/// the console: the password of its user info, and the values of query
/// parameters that carry secrets (`password`, `sslpassword`, `token`,
/// `secret`, `*key`, …). Parsed with the `url` crate, so `@` or `:` in a
/// path or query are left alone; a string that is not a URL keeps nothing
/// before its last `@`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.cannot_be_a_base() => {
            if parsed.password().is_some() {
                // Only URLs that cannot carry credentials refuse this, and
                // those have no password to hide.
                let _ = parsed.set_password(Some("***"));
            }
            let secret = |name: &str| {
                let name = name.to_ascii_lowercase();
                ["pass", "pwd", "secret", "token", "key", "credential", "auth"]
                    .iter()
                    .any(|s| name.contains(s))
            };
            if parsed.query_pairs().any(|(k, _)| secret(&k)) {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret(&k) { "***".to_string() } else { v.into_owned() };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        _ => match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_string(),
        },
    }
}

/// `text` (a client library's error about `url`) with the URL's user and
/// password replaced by `***` wherever it quotes them.
pub fn without_credentials(text: &str, url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    match rest.rsplit_once('@') {
        Some((userinfo, _)) if !userinfo.is_empty() => text.replace(userinfo, "***"),
        _ => text.to_string(),
    }
}

/// This machine's host name (for worker and consumer names), or `worker`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// `text` cut to at most `max` bytes on a character boundary, marked
/// `… [truncated]` when it was cut.
pub fn truncate_utf8(mut text: String, max: usize) -> String {
    if text.len() > max {
        text.truncate(floor_char_boundary(&text, max));
        text.push_str("… [truncated]");
    }
    text
}

/// The last `max_chars` characters of `text`.
pub fn tail_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().rev().nth(max_chars.saturating_sub(1)) {
        Some((i, _)) if max_chars > 0 => &text[i..],
        _ if max_chars == 0 => "",
        _ => text,
    }
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_quoted_in_an_error_are_hidden() {
        let url = "amqp://guest:s3cret@rabbit:5672/%2f";
        assert_eq!(
            without_credentials(&format!("Invalid URL: '{url}'"), url),
            "Invalid URL: 'amqp://***@rabbit:5672/%2f'"
        );
        let bare = "guest:s3cret@rabbit:5672";
        assert_eq!(without_credentials(&format!("bad: {bare}"), bare), "bad: ***@rabbit:5672");
        assert_eq!(without_credentials("refused", "amqp://rabbit"), "refused");
    }

    #[test]
    fn redaction_hides_passwords_only() {
        assert_eq!(redact_url("amqp://guest:secret@h:5672/%2f"), "amqp://guest:***@h:5672/%2f");
        assert_eq!(redact_url("postgres://postgres@h/db"), "postgres://postgres@h/db");
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact_url("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact_url("redis://u:p@h"), "redis://u:***@h");
        assert_eq!(redact_url("amqp://user@h"), "amqp://user@h");
    }

    #[test]
    fn an_at_sign_in_the_query_is_not_a_credential() {
        assert_eq!(redact_url("amqp://h:5672/%2f?x=a@b"), "amqp://h:5672/%2f?x=a@b");
        assert_eq!(
            redact_url("postgres://u:p%40ss@h/db?application_name=a@b"),
            "postgres://u:***@h/db?application_name=a@b"
        );
    }

    #[test]
    fn secrets_in_the_query_are_hidden_too() {
        assert_eq!(
            redact_url("postgres://u@h/db?password=s3cret&sslmode=disable"),
            "postgres://u@h/db?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("http://h:4566/?AccessKey=a&x=1"), "http://h:4566/?AccessKey=***&x=1");
        assert_eq!(redact_url("redis://h:6379/0?protocol=resp3"), "redis://h:6379/0?protocol=resp3");
    }

    #[test]
    fn what_is_not_a_url_keeps_nothing_before_its_last_at() {
        assert_eq!(redact_url("u:secret@h:5432"), "***@h:5432");
        assert_eq!(redact_url("localhost"), "localhost");
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_utf8("héllo".into(), 2), "h… [truncated]");
        assert_eq!(truncate_utf8("hello".into(), 5), "hello");
        assert_eq!(tail_chars("héllo", 4), "éllo");
        assert_eq!(tail_chars("hé", 10), "hé");
        assert_eq!(tail_chars("hé", 0), "");
    }
}
