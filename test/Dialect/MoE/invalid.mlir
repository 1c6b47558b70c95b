// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Every verifier and parser error of the moe dialect, one per split.
// The messages name things in the user's terms (tokens, experts, hidden,
// top_k, offsets, MX axis and block).

// router: logits must be 2-d [tokens, experts].
func.func @router_rank(%l: tensor<2x16x8xf32>) {
  // expected-error @+1 {{'moe.router' op expects logits to have rank 2, got rank 3 ('tensor<2x16x8xf32>')}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<2x16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: indices must be 2-d.
func.func @router_indices_rank(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expects indices to have rank 2, got rank 1 ('tensor<32xi32>')}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<16x8xf32> -> tensor<32xi32>, tensor<16x2xf32>
  return
}

// -----

// router: top_k larger than the number of experts.
func.func @router_topk_too_large(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expects top_k <= number of experts, got top_k = 9 with 8 experts}}
  %i, %w = moe.router %l top_k(9) softmax : tensor<16x8xf32> -> tensor<16x9xi32>, tensor<16x9xf32>
  return
}

// -----

// router: top_k = 0.
func.func @router_topk_zero(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{attribute 'top_k' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %i, %w = moe.router %l top_k(0) softmax : tensor<16x8xf32> -> tensor<16x0xi32>, tensor<16x0xf32>
  return
}

// -----

// router: negative top_k.
func.func @router_topk_negative(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{attribute 'top_k' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %i, %w = moe.router %l top_k(-1) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: top_k does not fit in 64 bits.
func.func @router_topk_overflow(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{integer constant out of range for attribute}}
  %i, %w = moe.router %l top_k(99999999999999999999) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: indices token count differs from logits.
func.func @router_tokens(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expects indices dim 0 (tokens) to be 16, got 15}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<16x8xf32> -> tensor<15x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: weights do not have top_k columns.
func.func @router_weights_topk(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expects weights dim 1 (top_k) to be 2, got 3}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x3xf32>
  return
}

// -----

// router: weights must be f32.
func.func @router_weights_type(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{result #1 must be ranked tensor of 32-bit float values, but got 'tensor<16x2xbf16>'}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xbf16>
  return
}

// -----

// router: indices must be i32 or i64.
func.func @router_indices_type(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{result #0 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values, but got 'tensor<16x2xf32>'}}
  %i, %w = moe.router %l top_k(2) softmax : tensor<16x8xf32> -> tensor<16x2xf32>, tensor<16x2xf32>
  return
}

// -----

// router: softmax_after_topk only makes sense for softmax.
func.func @router_after_topk_sigmoid(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{softmax_after_topk needs the softmax score function}}
  %i, %w = moe.router %l top_k(2) sigmoid softmax_after_topk : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: unknown score function keyword.
func.func @router_unknown_score(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'score' [softmax, sigmoid]}}
  %i, %w = moe.router %l top_k(2) relu : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router: misspelled unit attribute keyword.
func.func @router_misspelled_flag(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{expected ':'}}
  %i, %w = moe.router %l top_k(2) softmax norm_top_k_prob : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// router (generic form): misspelled attribute name, so top_k is missing.
func.func @router_generic_misspelled(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{'moe.router' op requires attribute 'top_k'}}
  %i:2 = "moe.router"(%l) <{topk = 2 : i64, score = 0 : i32}> : (tensor<16x8xf32>) -> (tensor<16x2xi32>, tensor<16x2xf32>)
  return
}

// -----

// router (generic form): enum value out of range.
func.func @router_generic_bad_enum(%l: tensor<16x8xf32>) {
  // expected-error @+1 {{Invalid attribute `score` in property conversion: 7 : i32}}
  %i:2 = "moe.router"(%l) <{top_k = 2 : i64, score = 7 : i32}> : (tensor<16x8xf32>) -> (tensor<16x2xi32>, tensor<16x2xf32>)
  return
}

// -----

// dispatch: sorted has fewer rows than the dropless worst case (6 x 2).
func.func @dispatch_sorted_too_small(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to have at least 12 rows (the worst case for 6 tokens x 2 experts each over 4 experts), got 11}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<11x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: padding every group to 32 rows needs (12 + 4*31) / 32 * 32 = 128 rows.
func.func @dispatch_sorted_too_small_padded(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to have at least 128 rows (the worst case for 6 tokens x 2 experts each over 4 experts, padded to 32), got 12}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(32) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: capacity ceil(1.0 * 12 / 4) = 3 per expert, 12 rows.
func.func @dispatch_sorted_too_small_capacity(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to have at least 12 rows}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(1.0) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<8x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: capacity ceil(0.5 * 12 / 4) = 2, padded to 4 rows per expert: 16 rows.
func.func @dispatch_sorted_too_small_capacity_padded(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to have at least 16 rows (the worst case for 6 tokens x 2 experts each over 4 experts, padded to 4), got 12}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(0.5) pad_to(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: pad_to(0).
func.func @dispatch_pad_to_zero(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{attribute 'pad_to' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(0) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: a pad_to so large that the worst-case row count overflows.
func.func @dispatch_pad_to_overflow(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects the worst-case row count (6 tokens x 2 + 4 experts x (pad_to - 1), pad_to = 9223372036854775807) to fit in 64 bits}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) pad_to(9223372036854775807) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: negative capacity factor.
func.func @dispatch_negative_capacity(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(-1.0) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: zero capacity factor.
func.func @dispatch_zero_capacity(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(0.0) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: NaN capacity factor.
func.func @dispatch_nan_capacity(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(0x7FF8000000000000) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: capacity factor written as an integer.
func.func @dispatch_integer_capacity(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+2 {{unexpected decimal integer literal for a floating point value}}
  // expected-note @+1 {{add a trailing dot to make the literal a float}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(2) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: zero experts.
func.func @dispatch_zero_experts(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{attribute 'num_experts' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(0) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<1xi32>, tensor<0xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: offsets must have experts + 1 entries.
func.func @dispatch_offsets_size(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects 5 offsets (one more than the 4 experts), got 4}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<4xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: a huge expert count must not wrap around when adding one.
func.func @dispatch_offsets_huge_experts(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects 9223372036854775808 offsets (one more than the 9223372036854775807 experts), got 5}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(9223372036854775807) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: counts must have one entry per expert.
func.func @dispatch_counts_size(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects counts size (experts) to be 4, got 5}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<5xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: indices for a different number of tokens.
func.func @dispatch_indices_tokens(%x: tensor<6x16xbf16>, %idx: tensor<7x2xi32>) {
  // expected-error @+1 {{expects indices dim 0 (tokens) to be 6, got 7}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<7x2xi32> -> tensor<14x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<7x2xi32>
  return
}

// -----

// dispatch: sorted rows of a different hidden size.
func.func @dispatch_hidden(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted dim 1 (hidden) to be 16, got 32}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x32xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: sorted keeps the tokens' element type.
func.func @dispatch_sorted_type(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to hold the rows of tokens ('tensor<6x16xbf16>'), got 'tensor<12x16xf32>'}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: positions must be [tokens, top_k].
func.func @dispatch_positions(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects positions dim 1 (top_k) to be 2, got 1}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x1xi32>
  return
}

// -----

// dispatch: tokens must be 2-d.
func.func @dispatch_tokens_rank(%x: tensor<6x16x2xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects tokens to have rank 2, got rank 3 ('tensor<6x16x2xbf16>')}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16x2xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: a dynamic row count for sorted.
func.func @dispatch_dynamic_rows(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>) {
  // expected-error @+1 {{expects sorted to have a static number of rows, got 'tensor<?x16xbf16>'}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<?x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

// -----

// dispatch: a dynamic token count.
func.func @dispatch_dynamic_tokens(%x: tensor<?x16xbf16>, %idx: tensor<?x2xi32>) {
  // expected-error @+1 {{expects a static number of tokens and top_k (indices dims 0 and 1), got 'tensor<?x2xi32>'}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<?x16xbf16>, tensor<?x2xi32> -> tensor<64x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<?x2xi32>
  return
}

// -----

// dispatch: capacity_factor with a dynamic token count.
func.func @dispatch_dynamic_capacity(%x: tensor<?x16xbf16>, %idx: tensor<?x2xi32>) {
  // expected-error @+1 {{capacity_factor needs a static number of tokens and top_k}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) capacity_factor(1.0) : tensor<?x16xbf16>, tensor<?x2xi32> -> tensor<64x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<?x2xi32>
  return
}

// -----

// combine: result hidden size differs from the expert outputs.
func.func @combine_hidden(%y: tensor<12x16xf32>, %w: tensor<6x2xf32>, %p: tensor<6x2xi32>) {
  // expected-error @+1 {{expects result dim 1 (hidden) to be 16, got 8}}
  %0 = moe.combine %y, %w, %p : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x8xf32>
  return
}

// -----

// combine: result token count differs from the weights.
func.func @combine_tokens(%y: tensor<12x16xf32>, %w: tensor<6x2xf32>, %p: tensor<6x2xi32>) {
  // expected-error @+1 {{expects result dim 0 (tokens) to be 6, got 12}}
  %0 = moe.combine %y, %w, %p : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<12x16xf32>
  return
}

// -----

// combine: positions and weights disagree on top_k.
func.func @combine_topk(%y: tensor<12x16xf32>, %w: tensor<6x2xf32>, %p: tensor<6x3xi32>) {
  // expected-error @+1 {{expects positions dim 1 (top_k) to be 2, got 3}}
  %0 = moe.combine %y, %w, %p : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x3xi32> -> tensor<6x16xf32>
  return
}

// -----

// combine: weights must be f32.
func.func @combine_weights_type(%y: tensor<12x16xf32>, %w: tensor<6x2xbf16>, %p: tensor<6x2xi32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit float values, but got 'tensor<6x2xbf16>'}}
  %0 = moe.combine %y, %w, %p : tensor<12x16xf32>, tensor<6x2xbf16>, tensor<6x2xi32> -> tensor<6x16xf32>
  return
}

// -----

// combine: expert outputs must be 2-d.
func.func @combine_rank(%y: tensor<12xf32>, %w: tensor<6x2xf32>, %p: tensor<6x2xi32>) {
  // expected-error @+1 {{expects expert_out to have rank 2, got rank 1 ('tensor<12xf32>')}}
  %0 = moe.combine %y, %w, %p : tensor<12xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xf32>
  return
}

// -----

// experts: the body takes the rows plus one argument per weight.
func.func @experts_arg_count(%s: tensor<12x16xbf16>, %o: tensor<5xi32>, %w: tensor<4x16x16xbf16>) {
  // expected-error @+1 {{expects the body to take 2 arguments (the group's rows and one per weight), got 1}}
  %y = moe.experts %s, %o weights(%w : tensor<4x16x16xbf16>) : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: body argument #0 must be the group's rows, tensor<?xHxT>.
func.func @experts_rows_type(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects body argument #0 (the group's rows) to be 'tensor<?x16xbf16>', got 'tensor<12x16xbf16>'}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<12x16xbf16>):
    %d = tensor.cast %x : tensor<12x16xbf16> to tensor<?x16xbf16>
    moe.yield %d : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: a weight argument must be one expert's slice.
func.func @experts_weight_slice(%s: tensor<12x16xbf16>, %o: tensor<5xi32>, %w: tensor<4x16x16xbf16>) {
  // expected-error @+1 {{expects body argument #1 (one expert's slice of weight #0) to be 'tensor<16x16xbf16>', got 'tensor<4x16x16xbf16>'}}
  %y = moe.experts %s, %o weights(%w : tensor<4x16x16xbf16>) : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>, %a: tensor<4x16x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: the body yields the group's output rows.
func.func @experts_yield_type(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the body to yield 'tensor<?x16xf32>' (the group's output rows), got 'tensor<?x16xbf16>'}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xf32> {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: a body without a terminator.
func.func @experts_no_terminator(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    // expected-error @+1 {{block with no terminator}}
    %c = arith.constant 0 : index
  }
  return
}

// -----

// experts: an empty body.
func.func @experts_empty_body(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{'moe.experts' op expects a non-empty block}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
  }
  return
}

// -----

// experts: a body ending in a terminator other than moe.yield.
func.func @experts_wrong_terminator(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the body to end with moe.yield}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    llvm.unreachable
  }
  return
}

// -----

// experts: every weight is stacked over the experts.
func.func @experts_weight_experts(%s: tensor<12x16xbf16>, %o: tensor<5xi32>, %w: tensor<3x16x16xbf16>) {
  // expected-error @+1 {{expects weight #0 dim 0 (experts) to be 4, got 3}}
  %y = moe.experts %s, %o weights(%w : tensor<3x16x16xbf16>) : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>, %a: tensor<16x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: a 0-d weight has no expert dimension.
func.func @experts_scalar_weight(%s: tensor<12x16xbf16>, %o: tensor<5xi32>, %w: tensor<f32>) {
  // expected-error @+1 {{expects weight #0 to have a leading expert dimension}}
  %y = moe.experts %s, %o weights(%w : tensor<f32>) : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>, %a: tensor<f32>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: offsets must have a static size.
func.func @experts_dynamic_offsets(%s: tensor<12x16xbf16>, %o: tensor<?xi32>) {
  // expected-error @+1 {{expects a static number of offsets (experts + 1)}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<?xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: offsets need at least one entry.
func.func @experts_empty_offsets(%s: tensor<12x16xbf16>, %o: tensor<0xi32>) {
  // expected-error @+1 {{expects at least one offset (experts + 1), got 0}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<0xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: the result has one row per input row.
func.func @experts_result_rows(%s: tensor<12x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result dim 0 (rows) to be 12, got 6}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<6x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return
}

// -----

// experts: the body is isolated from above.
func.func @experts_isolated(%s: tensor<12x16xbf16>, %o: tensor<5xi32>, %v: tensor<?x16xbf16>) {
  // expected-note @+1 {{required by region isolation constraints}}
  %y = moe.experts %s, %o : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16> {
  ^bb0(%x: tensor<?x16xbf16>):
    // expected-error @+1 {{using value defined outside the region}}
    moe.yield %v : tensor<?x16xbf16>
  }
  return
}

// -----

// yield: only inside moe.experts.
func.func @yield_outside(%x: tensor<6x16xbf16>) {
  // expected-error @+1 {{'moe.yield' op expects parent op 'moe.experts'}}
  moe.yield %x : tensor<6x16xbf16>
}

// -----

// grouped_matmul: rhs must be stacked expert weights [E, K, N].
func.func @gmm_rhs_rank(%x: tensor<12x16xbf16>, %w: tensor<16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects rhs (stacked expert weights) to have rank 3, got rank 2 ('tensor<16x64xbf16>')}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x16xbf16>, tensor<16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  return
}

// -----

// grouped_matmul: contraction sizes differ.
func.func @gmm_k(%x: tensor<12x32xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects rhs contraction dim (K, lhs dim 1) to be 32, got 16}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x32xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  return
}

// -----

// grouped_matmul: with transpose_rhs, K is rhs dim 2.
func.func @gmm_k_transposed(%x: tensor<12x16xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects rhs contraction dim (K, lhs dim 1) to be 16, got 64}}
  %0 = moe.grouped_matmul %x, %w, %o transpose_rhs : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x16xf32>
  return
}

// -----

// grouped_matmul: offsets for a different number of experts.
func.func @gmm_offsets(%x: tensor<12x16xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<9xi32>) {
  // expected-error @+1 {{expects 5 offsets (one more than the 4 experts), got 9}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<9xi32> -> tensor<12x64xf32>
  return
}

// -----

// grouped_matmul: result columns are rhs N.
func.func @gmm_n(%x: tensor<12x16xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result dim 1 (N) to be 64, got 32}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x32xf32>
  return
}

// -----

// grouped_matmul: result rows are lhs rows.
func.func @gmm_rows(%x: tensor<12x16xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result dim 0 (rows) to be 12, got 16}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<16x64xf32>
  return
}

// -----

// grouped_matmul: MX lhs blocked along the rows (columnwise).
func.func @gmm_mx_lhs_axis(%x: !moe.mx<128x64xf8E4M3FN, axis = 0>, %w: tensor<4x64x32xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of lhs along dimension 1 (the contraction dimension), got axis = 0}}
  %0 = moe.grouped_matmul %x, %w, %o : !moe.mx<128x64xf8E4M3FN, axis = 0>, tensor<4x64x32xbf16>, tensor<5xi32> -> tensor<128x32xf32>
  return
}

// -----

// grouped_matmul: MX rhs blocked along N instead of K.
func.func @gmm_mx_rhs_axis(%x: tensor<128x64xbf16>, %w: !moe.mx<4x64x32xf8E4M3FN, axis = 2>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of rhs along dimension 1 (the contraction dimension), got axis = 2}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<128x64xbf16>, !moe.mx<4x64x32xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<128x32xf32>
  return
}

// -----

// grouped_matmul: with transpose_rhs the MX blocks of rhs run along dim 2.
func.func @gmm_mx_rhs_axis_transposed(%x: tensor<128x64xbf16>, %w: !moe.mx<4x32x64xf8E4M3FN, axis = 1>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of rhs along dimension 2 (the contraction dimension), got axis = 1}}
  %0 = moe.grouped_matmul %x, %w, %o transpose_rhs : tensor<128x64xbf16>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x32xf32>
  return
}

// -----

// grouped_matmul: integer lhs.
func.func @gmm_int_lhs(%x: tensor<12x16xi32>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{operand #0 must be float tensor or block-scaled tensor (MX or blockwise FP8), but got 'tensor<12x16xi32>'}}
  %0 = moe.grouped_matmul %x, %w, %o : tensor<12x16xi32>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  return
}

// -----

// grouped_matmul_wgrad: MX lhs must be columnwise (axis 0).
func.func @wgrad_mx_lhs_axis(%x: !moe.mx<128x64xf8E4M3FN, axis = 1>, %dh: tensor<128x32xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of lhs along dimension 0 (the rows are contracted: columnwise), got axis = 1}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : !moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<128x32xbf16>, tensor<5xi32> -> tensor<4x64x32xf32>
  return
}

// -----

// grouped_matmul_wgrad: MX rhs must be columnwise (axis 0).
func.func @wgrad_mx_rhs_axis(%x: tensor<128x64xbf16>, %dh: !moe.mx<128x32xf8E5M2, axis = 1>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of rhs along dimension 0 (the rows are contracted: columnwise), got axis = 1}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : tensor<128x64xbf16>, !moe.mx<128x32xf8E5M2, axis = 1>, tensor<5xi32> -> tensor<4x64x32xf32>
  return
}

// -----

// grouped_matmul_wgrad: lhs and rhs have different row counts.
func.func @wgrad_rows(%x: tensor<12x16xbf16>, %dh: tensor<10x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects rhs dim 0 (rows) to be 12, got 10}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : tensor<12x16xbf16>, tensor<10x64xbf16>, tensor<5xi32> -> tensor<4x16x64xf32>
  return
}

// -----

// grouped_matmul_wgrad: result is [E, K, N].
func.func @wgrad_result_rank(%x: tensor<12x16xbf16>, %dh: tensor<12x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result (stacked weight gradients) to have rank 3, got rank 2 ('tensor<16x64xf32>')}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<5xi32> -> tensor<16x64xf32>
  return
}

// -----

// grouped_matmul_wgrad: result dim 2 is rhs dim 1.
func.func @wgrad_n(%x: tensor<12x16xbf16>, %dh: tensor<12x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result dim 2 (N) to be 64, got 32}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<5xi32> -> tensor<4x16x32xf32>
  return
}

// -----

// grouped_matmul_wgrad: offsets for a different number of experts.
func.func @wgrad_offsets(%x: tensor<12x16xbf16>, %dh: tensor<12x64xbf16>, %o: tensor<4xi32>) {
  // expected-error @+1 {{expects 5 offsets (one more than the 4 experts), got 4}}
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<4xi32> -> tensor<4x16x64xf32>
  return
}

// -----

// swiglu: odd last dimension cannot hold gate and up.
func.func @swiglu_odd(%h: tensor<12x63xf32>) {
  // expected-error @+1 {{expects the last dimension of input (gate and up) to be even, got 63}}
  %0 = moe.swiglu %h : tensor<12x63xf32> -> tensor<12x31xf32>
  return
}

// -----

// swiglu: result last dim is half of the input's.
func.func @swiglu_half(%h: tensor<12x64xf32>) {
  // expected-error @+1 {{expects result last dim (half of input) to be 32, got 64}}
  %0 = moe.swiglu %h : tensor<12x64xf32> -> tensor<12x64xf32>
  return
}

// -----

// swiglu: leading dims must match.
func.func @swiglu_rows(%h: tensor<12x64xf32>) {
  // expected-error @+1 {{expects result dim 0 to be 12, got 6}}
  %0 = moe.swiglu %h : tensor<12x64xf32> -> tensor<6x32xf32>
  return
}

// -----

// swiglu: ranks must match.
func.func @swiglu_rank(%h: tensor<12x64xf32>) {
  // expected-error @+1 {{expects input and result to have the same rank (at least 1), got 2 and 1}}
  %0 = moe.swiglu %h : tensor<12x64xf32> -> tensor<32xf32>
  return
}

// -----

// swiglu: 0-d input.
func.func @swiglu_scalar(%h: tensor<f32>) {
  // expected-error @+1 {{expects input and result to have the same rank (at least 1), got 0 and 0}}
  %0 = moe.swiglu %h : tensor<f32> -> tensor<f32>
  return
}

// -----

// swiglu: dynamic last dimension.
func.func @swiglu_dynamic(%h: tensor<12x?xf32>) {
  // expected-error @+1 {{expects a static last dimension (gate and up)}}
  %0 = moe.swiglu %h : tensor<12x?xf32> -> tensor<12x?xf32>
  return
}

// -----

// swiglu: unknown layout keyword.
func.func @swiglu_bad_layout(%h: tensor<12x64xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'layout' [split, interleaved]}}
  %0 = moe.swiglu %h layout(packed) : tensor<12x64xf32> -> tensor<12x32xf32>
  return
}

// -----

// swiglu_grad: grad must be half of the input.
func.func @swiglu_grad_half(%h: tensor<12x64xf32>, %g: tensor<12x64xf32>) {
  // expected-error @+1 {{expects grad last dim (half of input) to be 32, got 64}}
  %0 = moe.swiglu_grad %h, %g : tensor<12x64xf32>, tensor<12x64xf32> -> tensor<12x64xf32>
  return
}

// -----

// swiglu_grad: grad rows differ from the input's.
func.func @swiglu_grad_rows(%h: tensor<12x64xf32>, %g: tensor<10x32xf32>) {
  // expected-error @+1 {{expects grad dim 0 to be 12, got 10}}
  %0 = moe.swiglu_grad %h, %g : tensor<12x64xf32>, tensor<10x32xf32> -> tensor<12x64xf32>
  return
}

// -----

// swiglu_grad: the result has the input's shape.
func.func @swiglu_grad_result(%h: tensor<12x64xf32>, %g: tensor<12x32xf32>) {
  // expected-error @+1 {{expects the result to have the input's shape 'tensor<12x64xf32>', got 'tensor<12x32xf32>'}}
  %0 = moe.swiglu_grad %h, %g : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x32xf32>
  return
}

// -----

// mx: element type f32 is not a narrow MX element.
// expected-error @+1 {{expects MX element type f8E4M3FN or f8E5M2, got 'f32'}}
func.func @mx_f32(%q: !moe.mx<32xf32, axis = 0>) {
  return
}

// -----

// mx: element type bf16.
// expected-error @+1 {{expects MX element type f8E4M3FN or f8E5M2, got 'bf16'}}
func.func @mx_bf16(%q: !moe.mx<4x64xbf16, axis = 1>) {
  return
}

// -----

// mx: the scale type is not an element type.
// expected-error @+1 {{expects MX element type f8E4M3FN or f8E5M2, got 'f8E8M0FNU'}}
func.func @mx_e8m0(%q: !moe.mx<4x64xf8E8M0FNU, axis = 1>) {
  return
}

// -----

// mx: axis out of range.
// expected-error @+1 {{scaled axis 2 is out of range for a 2-d MX tensor}}
func.func @mx_axis_range(%q: !moe.mx<4x64xf8E4M3FN, axis = 2>) {
  return
}

// -----

// mx: negative axis.
// expected-error @+1 {{expects the MX axis to be in [0, rank), got axis = -1 for a 2-d MX tensor}}
func.func @mx_axis_negative(%q: !moe.mx<4x64xf8E4M3FN, axis = -1>) {
  return
}

// -----

// mx: an axis that would wrap around to 0 as a 32-bit unsigned value.
// expected-error @+1 {{expects the MX axis to be in [0, rank), got axis = 4294967296 for a 1-d MX tensor}}
func.func @mx_axis_wrap(%q: !moe.mx<32xf8E4M3FN, axis = 4294967296>) {
  return
}

// -----

// mx: scaled dim not a multiple of the block size 32.
// expected-error @+1 {{the scaled dimension (axis 1) has size 48, which is not a multiple of the block size 32 (pad it, e.g. with moe.dispatch pad_to)}}
func.func @mx_not_multiple(%q: !moe.mx<4x48xf8E4M3FN, axis = 1>) {
  return
}

// -----

// mx: scaled dim not a multiple of a custom block size.
// expected-error @+1 {{the scaled dimension (axis 0) has size 32, which is not a multiple of the block size 64}}
func.func @mx_not_multiple_block(%q: !moe.mx<32x4xf8E5M2, axis = 0, block = 64>) {
  return
}

// -----

// mx: dynamic scaled dim.
// expected-error @+1 {{the scaled dimension (axis 1) of an MX tensor must be static}}
func.func @mx_dynamic(%q: !moe.mx<4x?xf8E4M3FN, axis = 1>) {
  return
}

// -----

// mx: block = 0.
// expected-error @+1 {{expects the MX block size to be in [1, 1048576], got block = 0}}
func.func @mx_block_zero(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, block = 0>) {
  return
}

// -----

// mx: 0-d MX tensor.
// expected-error @+1 {{an MX tensor needs at least one dimension}}
func.func @mx_scalar(%q: !moe.mx<f8E4M3FN, axis = 0>) {
  return
}

// -----

// mx: missing axis.
// expected-error @+1 {{expected ','}}
func.func @mx_missing_axis(%q: !moe.mx<4x64xf8E4M3FN>) {
  return
}

// -----

// mx: misspelled block keyword.
// expected-error @+1 {{expected 'block'}}
func.func @mx_block_keyword(%q: !moe.mx<4x64xf8E4M3FN, axis = 1, blocks = 16>) {
  return
}

// -----

// mx: unknown moe type.
// expected-error @+1 {{unknown  type `nope` in dialect `moe`}}
func.func @unknown_type(%q: !moe.nope<4x64xf8E4M3FN>) {
  return
}

// -----

// quantize: result shape differs from the input.
func.func @quantize_shape(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expects result dim 1 (from input) to be 64, got 128}}
  %0 = moe.quantize %x : tensor<4x64xbf16> -> !moe.mx<4x128xf8E4M3FN, axis = 1>
  return
}

// -----

// quantize: result rank differs from the input.
func.func @quantize_rank(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expects input and result to have the same rank, got 2 and 1}}
  %0 = moe.quantize %x : tensor<4x64xbf16> -> !moe.mx<256xf8E4M3FN, axis = 0>
  return
}

// -----

// quantize: the result must be an MX tensor.
func.func @quantize_not_mx(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{result #0 must be block-scaled tensor (MX or blockwise FP8), but got 'tensor<4x64xf8E4M3FN>'}}
  %0 = moe.quantize %x : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>
  return
}

// -----

// quantize: unknown scale mode.
func.func @quantize_bad_scale(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'scale_mode' [rceil, floor]}}
  %0 = moe.quantize %x scale(round) : tensor<4x64xbf16> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return
}

// -----

// dequantize: result shape differs from the input.
func.func @dequantize_shape(%q: !moe.mx<4x64xf8E4M3FN, axis = 1>) {
  // expected-error @+1 {{expects result dim 0 (from input) to be 4, got 8}}
  %0 = moe.dequantize %q : !moe.mx<4x64xf8E4M3FN, axis = 1> -> tensor<8x64xf32>
  return
}

// -----

// dequantize: the input must be an MX tensor.
func.func @dequantize_not_mx(%q: tensor<4x64xf8E4M3FN>) {
  // expected-error @+1 {{operand #0 must be block-scaled tensor (MX or blockwise FP8), but got 'tensor<4x64xf8E4M3FN>'}}
  %0 = moe.dequantize %q : tensor<4x64xf8E4M3FN> -> tensor<4x64xf32>
  return
}

// -----

// mx_pack: data element type differs from the MX type's.
func.func @pack_data_type(%d: tensor<4x64xf8E5M2>, %s: tensor<4x2xf8E8M0FNU>) {
  // expected-error @+1 {{expects the data of '!moe.mx<4x64xf8E4M3FN, axis = 1>' to be 'tensor<4x64xf8E4M3FN>', got 'tensor<4x64xf8E5M2>'}}
  %0 = moe.mx_pack %d, %s : tensor<4x64xf8E5M2>, tensor<4x2xf8E8M0FNU> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return
}

// -----

// mx_pack: one scale per 32 values along axis 1 is 4x2, not 4x4.
func.func @pack_scales_shape(%d: tensor<4x64xf8E4M3FN>, %s: tensor<4x4xf8E8M0FNU>) {
  // expected-error @+1 {{expects the scales of '!moe.mx<4x64xf8E4M3FN, axis = 1>' to be 'tensor<4x2xf8E8M0FNU>', got 'tensor<4x4xf8E8M0FNU>'}}
  %0 = moe.mx_pack %d, %s : tensor<4x64xf8E4M3FN>, tensor<4x4xf8E8M0FNU> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return
}

// -----

// mx_pack: scales must be f8E8M0FNU.
func.func @pack_scales_type(%d: tensor<4x64xf8E4M3FN>, %s: tensor<4x2xf8E4M3FN>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of f8E8M0FNU type or 32-bit float values, but got 'tensor<4x2xf8E4M3FN>'}}
  %0 = moe.mx_pack %d, %s : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E4M3FN> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return
}

// -----

// mx_pack: data must be narrow floats.
func.func @pack_data_wide(%d: tensor<4x64xbf16>, %s: tensor<4x2xf8E8M0FNU>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of f8E4M3FN type or f8E5M2 type values, but got 'tensor<4x64xbf16>'}}
  %0 = moe.mx_pack %d, %s : tensor<4x64xbf16>, tensor<4x2xf8E8M0FNU> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return
}

// -----

// mx_unpack: scales for the wrong axis.
func.func @unpack_scales(%q: !moe.mx<64x4xf8E5M2, axis = 0>) {
  // expected-error @+1 {{expects the scales of '!moe.mx<64x4xf8E5M2, axis = 0>' to be 'tensor<2x4xf8E8M0FNU>', got 'tensor<64x1xf8E8M0FNU>'}}
  %d, %s = moe.mx_unpack %q : !moe.mx<64x4xf8E5M2, axis = 0> -> tensor<64x4xf8E5M2>, tensor<64x1xf8E8M0FNU>
  return
}

// -----

// mx_unpack: data shape differs.
func.func @unpack_data(%q: !moe.mx<64x4xf8E5M2, axis = 0>) {
  // expected-error @+1 {{expects the data of '!moe.mx<64x4xf8E5M2, axis = 0>' to be 'tensor<64x4xf8E5M2>', got 'tensor<4x64xf8E5M2>'}}
  %d, %s = moe.mx_unpack %q : !moe.mx<64x4xf8E5M2, axis = 0> -> tensor<4x64xf8E5M2>, tensor<2x4xf8E8M0FNU>
  return
}

// -----

// grouped_mlp: w1 hidden size differs from the input's.
func.func @mlp_hidden(%x: tensor<12x16xbf16>, %w1: tensor<4x32x64xbf16>, %w2: tensor<4x32x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects w1 dim 1 (hidden, input dim 1) to be 16, got 32}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x32x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  return
}

// -----

// grouped_mlp: w1 and w2 stack different numbers of experts.
func.func @mlp_experts(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<8x32x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects w2 dim 0 (experts) to be 4, got 8}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<8x32x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  return
}

// -----

// grouped_mlp: w2's ffn size is half of w1's gate+up.
func.func @mlp_ffn(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<4x64x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects w2 dim 1 (ffn, half of w1 dim 2) to be 32, got 64}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x64x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  return
}

// -----

// grouped_mlp: odd gate+up size.
func.func @mlp_odd(%x: tensor<12x16xbf16>, %w1: tensor<4x16x63xbf16>, %w2: tensor<4x32x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects w1 dim 2 (gate and up, 2 x ffn) to be even, got 63}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x16x63xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  return
}

// -----

// grouped_mlp: result columns are w2 dim 2.
func.func @mlp_result(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<4x32x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects result dim 1 (w2 dim 2) to be 16, got 32}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x32xbf16>
  return
}

// -----

// grouped_mlp: offsets for a different number of experts.
func.func @mlp_offsets(%x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<4x32x16xbf16>, %o: tensor<4xi32>) {
  // expected-error @+1 {{expects 5 offsets (one more than the 4 experts), got 4}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<4xi32> -> tensor<12x16xbf16>
  return
}

// -----

// grouped_mlp: MX w2 blocked along N.
func.func @mlp_mx_w2_axis(%x: tensor<128x64xbf16>, %w1: !moe.mx<4x64x256xf8E4M3FN, axis = 1>, %w2: !moe.mx<4x128x64xf8E4M3FN, axis = 2>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of w2 along dimension 1 (the contraction dimension), got axis = 2}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<128x64xbf16>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>, !moe.mx<4x128x64xf8E4M3FN, axis = 2>, tensor<5xi32> -> tensor<128x64xbf16>
  return
}

// -----

// grouped_mlp: MX input blocked columnwise.
func.func @mlp_mx_input_axis(%x: !moe.mx<128x64xf8E4M3FN, axis = 0>, %w1: tensor<4x64x256xbf16>, %w2: tensor<4x128x64xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects the MX blocks of input along dimension 1 (the contraction dimension), got axis = 0}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : !moe.mx<128x64xf8E4M3FN, axis = 0>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<5xi32> -> tensor<128x64xbf16>
  return
}

// -----

// grouped_mlp: w1 must be 3-d.
func.func @mlp_w1_rank(%x: tensor<12x16xbf16>, %w1: tensor<16x64xbf16>, %w2: tensor<4x32x16xbf16>, %o: tensor<5xi32>) {
  // expected-error @+1 {{expects w1 to have rank 3, got rank 2 ('tensor<16x64xbf16>')}}
  %0 = moe.grouped_mlp %x, %w1, %w2, %o : tensor<12x16xbf16>, tensor<16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  return
}

// -----

// all_to_all: the grid symbol does not exist.
func.func @a2a_unknown_grid(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects '@nogrid' to name a shard.grid, found none}}
  %r, %rc = moe.all_to_all %x, %c on @nogrid : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: the symbol names something that is not a grid.
func.func private @not_a_grid()
func.func @a2a_not_a_grid(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects '@not_a_grid' to name a shard.grid, found none}}
  %r, %rc = moe.all_to_all %x, %c on @not_a_grid : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: grid axis out of range.
shard.grid @ep(shape = 2)
func.func @a2a_axis_range(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{grid axis 1 is out of range for the 1-d grid @ep}}
  %r, %rc = moe.all_to_all %x, %c on @ep grid_axes = [1] : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: negative grid axis.
shard.grid @ep(shape = 2)
func.func @a2a_axis_negative(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{grid axis -1 is out of range for the 1-d grid @ep}}
  %r, %rc = moe.all_to_all %x, %c on @ep grid_axes = [-1] : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: duplicated grid axis.
shard.grid @ep_dp(shape = 2x4)
func.func @a2a_axis_twice(%x: tensor<64x16xbf16>, %c: tensor<8xi32>) {
  // expected-error @+1 {{grid axis 1 is listed twice}}
  %r, %rc = moe.all_to_all %x, %c on @ep_dp grid_axes = [1, 1] : tensor<64x16xbf16>, tensor<8xi32> -> tensor<128x16xbf16>, tensor<8xi32>
  return
}

// -----

// all_to_all over a grid of size 0 (once a division by zero in this check).
shard.grid @empty(shape = 0)
func.func @a2a_empty_grid(%x: tensor<64x16xbf16>, %c: tensor<8xi32>) {
  // expected-error @+1 {{expects a group of one or more ranks, but the grid @empty has size 0 along the exchange's axes}}
  %r, %rc = moe.all_to_all %x, %c on @empty : tensor<64x16xbf16>, tensor<8xi32> -> tensor<128x16xbf16>, tensor<8xi32>
  return
}

// -----

// all_to_all over an axis of size 0 of a 2x0 grid.
shard.grid @half_empty(shape = 2x0)
func.func @a2a_empty_axis(%x: tensor<64x16xbf16>, %c: tensor<8xi32>) {
  // expected-error @+1 {{expects a group of one or more ranks, but the grid @half_empty has size 0}}
  %r, %rc = moe.all_to_all %x, %c on @half_empty grid_axes = [1] : tensor<64x16xbf16>, tensor<8xi32> -> tensor<128x16xbf16>, tensor<8xi32>
  return
}

// -----

// all_to_all: send counts not a multiple of the group size (4 ranks).
shard.grid @ep_dp(shape = 2x4)
func.func @a2a_counts(%x: tensor<64x16xbf16>, %c: tensor<6xi32>) {
  // expected-error @+1 {{expects the number of send counts (6) to be a multiple of the group size (4 ranks), one or more counts per destination rank}}
  %r, %rc = moe.all_to_all %x, %c on @ep_dp grid_axes = [1] : tensor<64x16xbf16>, tensor<6xi32> -> tensor<128x16xbf16>, tensor<6xi32>
  return
}

// -----

// all_to_all: over the whole 2x4 grid the group has 8 ranks.
shard.grid @ep_dp(shape = 2x4)
func.func @a2a_counts_whole_grid(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects the number of send counts (4) to be a multiple of the group size (8 ranks)}}
  %r, %rc = moe.all_to_all %x, %c on @ep_dp : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: recv counts of another type.
shard.grid @ep(shape = 2)
func.func @a2a_recv_type(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects recv_counts to have the type of send_counts ('tensor<4xi32>'), got 'tensor<4xi64>'}}
  %r, %rc = moe.all_to_all %x, %c on @ep : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi64>
  return
}

// -----

// dispatch: MX rows move with their scales, blocks along the row only.
func.func @dispatch_mx_columnwise(%x: !moe.mx<64x16xf8E4M3FN, axis = 0>, %idx: tensor<64x2xi32>) {
  // expected-error @+1 {{moves whole rows; expects the blocks of tokens ('!moe.mx<64x16xf8E4M3FN, axis = 0>') to run along the row (axis = 1), got axis = 0}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : !moe.mx<64x16xf8E4M3FN, axis = 0>, tensor<64x2xi32> -> !moe.mx<128x16xf8E4M3FN, axis = 0>, tensor<5xi32>, tensor<4xi32>, tensor<64x2xi32>
  return
}

// -----

// dispatch: MX tokens give MX rows of the same format.
func.func @dispatch_mx_to_float(%x: !moe.mx<64x32xf8E4M3FN, axis = 1>, %idx: tensor<64x2xi32>) {
  // expected-error @+1 {{expects sorted to hold the rows of tokens ('!moe.mx<64x32xf8E4M3FN, axis = 1>'), got '!moe.mx<128x32xf8E5M2, axis = 1>'}}
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : !moe.mx<64x32xf8E4M3FN, axis = 1>, tensor<64x2xi32> -> !moe.mx<128x32xf8E5M2, axis = 1>, tensor<5xi32>, tensor<4xi32>, tensor<64x2xi32>
  return
}

// -----

// all_to_all: MX rows stay MX rows.
shard.grid @ep(shape = 2)
func.func @a2a_mx_to_float(%x: !moe.mx<64x32xf8E4M3FN, axis = 1>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects the result to hold the rows of the input ('!moe.mx<64x32xf8E4M3FN, axis = 1>'), got 'tensor<128x32xf32>'}}
  %r, %rc = moe.all_to_all %x, %c on @ep : !moe.mx<64x32xf8E4M3FN, axis = 1>, tensor<4xi32> -> tensor<128x32xf32>, tensor<4xi32>
  return
}

// -----

// all_to_all: the rows keep their element type.
shard.grid @ep(shape = 2)
func.func @a2a_elem_type(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects the result to hold the rows of the input ('tensor<64x16xbf16>'), got 'tensor<128x16xf32>'}}
  %r, %rc = moe.all_to_all %x, %c on @ep : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xf32>, tensor<4xi32>
  return
}

// -----

// all_to_all: the rows keep their size.
shard.grid @ep(shape = 2)
func.func @a2a_row_size(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{expects result dim 1 (row size) to be 16, got 32}}
  %r, %rc = moe.all_to_all %x, %c on @ep : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x32xbf16>, tensor<4xi32>
  return
}

// -----

// all_to_all: send counts must be 1-d.
shard.grid @ep(shape = 2)
func.func @a2a_counts_rank(%x: tensor<64x16xbf16>, %c: tensor<i32>) {
  // expected-error @+1 {{expects send_counts to have rank 1, got rank 0 ('tensor<i32>')}}
  %r, %rc = moe.all_to_all %x, %c on @ep : tensor<64x16xbf16>, tensor<i32> -> tensor<128x16xbf16>, tensor<i32>
  return
}

// -----

// An unknown moe op.
func.func @unknown_op(%x: tensor<4xf32>) {
  // expected-error @+1 {{custom op 'moe.foo' is unknown}}
  %0 = moe.foo %x : tensor<4xf32>
  return
}

// -----

// An unknown moe op in generic form.
func.func @unknown_op_generic(%x: tensor<4xf32>) {
  // expected-error @+1 {{unregistered operation 'moe.foo' found in dialect ('moe') that does not allow unknown operations}}
  %0 = "moe.foo"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

// all_to_all: padding applies to slot-major sides only.
shard.grid @ep(shape = 2)
func.func @a2a_pad_without_slots(%x: tensor<64x16xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{pads slots to 4 rows, but neither side is slot-major (pad_to applies to slot_major_input and slot_major_result)}}
  %r, %rc = moe.all_to_all %x, %c on @ep pad_to(4) : tensor<64x16xf32>, tensor<4xi32> -> tensor<128x16xf32>, tensor<4xi32>
  return
}

// -----

// slot_offsets: S + 1 offsets for S slots that divide the counts.
func.func @slot_offsets_size(%c: tensor<8xi32>) {
  // expected-error @+1 {{expects offsets of S + 1 entries, S >= 1 slots dividing the 8 counts, got 4 entries}}
  %o = moe.slot_offsets %c : tensor<8xi32> -> tensor<4xi32>
  return
}

// -----

// router: one selection bias per expert.
func.func @router_bias_size(%l: tensor<16x8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'moe.router' op expects bias size (the number of experts) to be 8, got 4}}
  %i, %w = moe.router %l bias(%b : tensor<4xf32>) top_k(2) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

// -----

// fp8block: one block size per dimension.
// expected-error @+1 {{expects one block size per dimension: 1 for a 2-d tensor}}
func.func @fp8block_block_rank(%q: !moe.fp8block<4x256xf8E4M3FN, block = [128]>) {
  return
}

// -----

// fp8block: block sizes are positive.
// expected-error @+1 {{block size 0 of dimension 1 is not in [1, 1048576]}}
func.func @fp8block_block_zero(%q: !moe.fp8block<4x256xf8E4M3FN, block = [1, 0]>) {
  return
}

// -----

// fp8block: FP8 elements only.
// expected-error @+1 {{expects FP8 element type f8E4M3FN or f8E5M2, got 'bf16'}}
func.func @fp8block_element(%q: !moe.fp8block<4x256xbf16, block = [1, 128]>) {
  return
}

// -----

// fp8block: only the pow2 flag may follow the blocks.
// expected-error @+1 {{expected 'pow2'}}
func.func @fp8block_flag(%q: !moe.fp8block<4x256xf8E4M3FN, block = [1, 128], pow3>) {
  return
}

// -----

// quantize: scale modes choose MX scales, not blockwise FP8 ones.
func.func @fp8block_scale_mode(%x: tensor<4x256xf32>) {
  // expected-error @+1 {{scale(floor) applies to MX results; a blockwise FP8 result's scales are set by its type (pow2 or not)}}
  %q = moe.quantize %x scale(floor) : tensor<4x256xf32> -> !moe.fp8block<4x256xf8E4M3FN, block = [1, 128]>
  return
}

// -----

// quantize: the shapes agree.
func.func @fp8block_quantize_shape(%x: tensor<4x256xf32>) {
  // expected-error @+1 {{expects result dim 1 (from input) to be 256, got 128}}
  %q = moe.quantize %x : tensor<4x256xf32> -> !moe.fp8block<4x128xf8E4M3FN, block = [1, 128]>
  return
}

// -----

// mx_unpack: blockwise FP8 scales are f32, one per tile (partial tiles too).
func.func @fp8block_unpack_scales(%q: !moe.fp8block<4x260xf8E4M3FN, block = [1, 128]>) {
  // expected-error @+1 {{expects the scales of '!moe.fp8block<4x260xf8E4M3FN, block = [1, 128]>' to be 'tensor<4x3xf32>', got 'tensor<4x2xf32>'}}
  %d, %s = moe.mx_unpack %q : !moe.fp8block<4x260xf8E4M3FN, block = [1, 128]> -> tensor<4x260xf8E4M3FN>, tensor<4x2xf32>
  return
}
