//! The command lines' usage errors as the one line `kvm` and `kvm-export` print for every
//! error (`kvm: error: ...`), from the several clap renders (the message, a blank line,
//! tips, a usage line, "For more information ...").

/// The message and tips of `rendered`, a clap usage error as it renders, in one line
/// without the `error: ` prefix, the usage line and the pointer to `--help`.
pub fn one_line(rendered: &str) -> String {
    let mut parts = rendered.split("\n\n").map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "));
    let first = parts.next().unwrap_or_default();
    let mut line = first.strip_prefix("error: ").unwrap_or(&first).to_string();
    for tip in parts.filter(|p| p.starts_with("tip: ")) {
        line.push_str(" (");
        line.push_str(&tip);
        line.push(')');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_usage_error_is_one_line_with_its_tips() {
        let invalid = "error: invalid value 'NaN' for '--temperature <TEMPERATURE>': must be in [0, 100]\n\n\
                       For more information, try '--help'.\n";
        assert_eq!(one_line(invalid), "invalid value 'NaN' for '--temperature <TEMPERATURE>': must be in [0, 100]");
        let missing = "error: the following required arguments were not provided:\n  --model <MODEL>\n\n\
                       Usage: kvm generate --model <MODEL>\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(missing), "the following required arguments were not provided: --model <MODEL>");
        let tip = "error: unexpected argument '--seeds' found\n\n  tip: a similar argument exists: '--seed'\n\n\
                   Usage: kvm generate <--model <MODEL>>\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(tip), "unexpected argument '--seeds' found (tip: a similar argument exists: '--seed')");
    }
}
