//! How deep a YAML text nests, found before it is parsed. libyaml (under `serde_yaml_ng`) keeps a
//! "simple key" per flow level and walks all of them at every token, so a document nested
//! `[[[[…` tens of thousands deep costs time quadratic in its depth, far under any byte cap: 0.4 s
//! at 10 000, 8.7 s at 50 000 on the development VM (`serde-yaml-ng` issue 16, libyaml pull
//! request 286). The text is scanned token by token with libyaml's own scanner first, which
//! tokenizes exactly as the parser will (quotes, comments, block scalars), and refused at the
//! first token past [`MAX_NESTING`]: each token then costs at most that many steps, so the scan
//! and the parse that follows are linear in the text. The files read (the agent's config, the
//! kubelet's, scenarios) nest a dozen levels at most.

use std::mem::MaybeUninit;

use unsafe_libyaml as unsafe_y;

/// The deepest a document may nest: flow and block collections together. serde_yaml_ng itself
/// refuses past 128, after the whole text was parsed.
pub const MAX_NESTING: usize = 32;

/// The text nests deeper than [`MAX_NESTING`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nested more than {max} levels deep at line {line} column {column}: a YAML file here nests a dozen levels at most (a deeper one would cost the parser time quadratic in its depth)")]
pub struct TooDeep {
    pub max: usize,
    /// 1-based, as an editor counts.
    pub line: usize,
    pub column: usize,
}

/// `Err` at the first collection nested past [`MAX_NESTING`]; `Ok` otherwise, including for
/// text that is not YAML (the parser that follows says what is wrong with it).
pub fn check_nesting(text: &str) -> Result<(), TooDeep> {
    let mut parser = Box::new(MaybeUninit::<unsafe_y::yaml_parser_t>::uninit());
    let parser = parser.as_mut_ptr();
    // SAFETY: `parser` points to memory for one parser, which `yaml_parser_initialize` fills
    // in whole (it zeroes it first); `text` outlives the parser, deleted below before return;
    // each token is deleted after it is looked at, and the parser once, on every path out.
    unsafe {
        if !unsafe_y::yaml_parser_initialize(parser).ok {
            return Ok(());
        }
        unsafe_y::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
        let mut depth = 0usize;
        let mut result = Ok(());
        loop {
            let mut token = MaybeUninit::<unsafe_y::yaml_token_t>::zeroed();
            if !unsafe_y::yaml_parser_scan(parser, token.as_mut_ptr()).ok {
                break;
            }
            let token = token.assume_init_mut();
            let kind = token.type_;
            let at = token.start_mark;
            unsafe_y::yaml_token_delete(token);
            match kind {
                unsafe_y::YAML_FLOW_SEQUENCE_START_TOKEN
                | unsafe_y::YAML_FLOW_MAPPING_START_TOKEN
                | unsafe_y::YAML_BLOCK_SEQUENCE_START_TOKEN
                | unsafe_y::YAML_BLOCK_MAPPING_START_TOKEN => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        result = Err(TooDeep {
                            max: MAX_NESTING,
                            line: at.line as usize + 1,
                            column: at.column as usize + 1,
                        });
                        break;
                    }
                }
                unsafe_y::YAML_FLOW_SEQUENCE_END_TOKEN
                | unsafe_y::YAML_FLOW_MAPPING_END_TOKEN
                | unsafe_y::YAML_BLOCK_END_TOKEN => depth = depth.saturating_sub(1),
                unsafe_y::YAML_STREAM_END_TOKEN | unsafe_y::YAML_NO_TOKEN => break,
                _ => {}
            }
        }
        unsafe_y::yaml_parser_delete(parser);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn flow(depth: usize) -> String {
        format!("eviction: {}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn nesting_past_the_cap_is_refused_where_it_starts_and_nothing_else_is() {
        let block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
            .collect();
        type Row = (&'static str, String, Option<(usize, usize)>);
        let rows: Vec<Row> = vec![
            (
                "the shipped config",
                include_str!("../../deploy/config.yaml").into(),
                None,
            ),
            ("flow, at the cap", flow(MAX_NESTING - 1), None),
            // The top mapping is the first level: the 32nd `[` the 33rd.
            (
                "flow, past it",
                flow(MAX_NESTING + 5),
                Some((1, 11 + MAX_NESTING - 1)),
            ),
            // The top mapping is a level: key k31 at line 32 opens the 33rd.
            (
                "block mappings, past it",
                block,
                Some((MAX_NESTING + 1, 2 * MAX_NESTING + 1)),
            ),
            (
                "brackets in quotes, comments and block scalars are no nesting",
                format!(
                    "a: '{0}'\nb: \"{0}\"\n# {0}\nc: |\n  {0}\n  '\nd: x'{0}\n",
                    "[".repeat(1000)
                ),
                None,
            ),
            (
                "not YAML: left to the parser",
                "a: [b\n  c: ]]]".into(),
                None,
            ),
            ("empty", String::new(), None),
        ];
        for (what, text, want) in rows {
            let got = check_nesting(&text).map_err(|e| (e.line, e.column));
            assert_eq!(got, want.map_or(Ok(()), Err), "{what}");
        }
        let e = check_nesting(&flow(100)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("nested more than {MAX_NESTING} levels deep at line 1 column {}: a YAML file here nests a dozen levels at most (a deeper one would cost the parser time quadratic in its depth)", 11 + MAX_NESTING - 1)
        );
    }

    /// The probe's file: 80 000 levels in 160 kB. Refused in milliseconds, not tens of seconds
    /// (the bound here is loose: the point is it is not quadratic).
    #[test]
    fn a_deep_file_is_refused_at_once() {
        let text = flow(80_000);
        let started = Instant::now();
        assert!(check_nesting(&text).is_err());
        assert!(
            started.elapsed().as_secs_f64() < 1.0,
            "{:?}",
            started.elapsed()
        );
    }
}
