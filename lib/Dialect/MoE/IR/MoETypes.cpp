//===- MoETypes.cpp - moe dialect types -----------------------------------===//

#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;

#include "moe/Dialect/MoE/IR/MoETypeInterfaces.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoETypes.cpp.inc"

void MoEDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "moe/Dialect/MoE/IR/MoETypes.cpp.inc"
      >();
}

/// Prints `shape` as `dims x` (`?` for dynamic ones), as tensor types do.
static void printDims(AsmPrinter &printer, ArrayRef<int64_t> shape) {
  for (int64_t d : shape) {
    if (ShapedType::isDynamic(d))
      printer << "?";
    else
      printer << d;
    printer << "x";
  }
}

//===----------------------------------------------------------------------===//
// MXTensorType
//===----------------------------------------------------------------------===//

/// Parses `<` dims `x` element-type `,` `axis` `=` N [`,` `block` `=` N] `>`.
Type MXTensorType::parse(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  SmallVector<int64_t> shape;
  Type elementType;
  if (parser.parseLess() ||
      parser.parseDimensionList(shape, /*allowDynamic=*/true,
                                /*withTrailingX=*/true) ||
      parser.parseType(elementType) || parser.parseComma() ||
      parser.parseKeyword("axis") || parser.parseEqual())
    return {};
  int64_t axis = 0, block = 32;
  if (parser.parseInteger(axis))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("block") || parser.parseEqual() ||
        parser.parseInteger(block))
      return {};
  }
  if (parser.parseGreater())
    return {};
  if (axis < 0 || axis > std::numeric_limits<int32_t>::max()) {
    // Out of range for any rank; checked here since `axis` is unsigned in
    // the type and a large value would otherwise wrap around.
    parser.emitError(loc, "expects the MX axis to be in [0, rank), got axis = ")
        << axis << " for a " << shape.size() << "-d MX tensor";
    return {};
  }
  if (block <= 0 || block > (1 << 20)) {
    parser.emitError(loc, "expects the MX block size to be in [1, 1048576], "
                          "got block = ")
        << block;
    return {};
  }
  return parser.getChecked<MXTensorType>(loc, parser.getContext(), shape,
                                         elementType, unsigned(axis),
                                         unsigned(block));
}

void MXTensorType::print(AsmPrinter &printer) const {
  printer << "<";
  printDims(printer, getShape());
  printer << getElementType() << ", axis = " << getAxis();
  if (getBlockSize() != 32)
    printer << ", block = " << getBlockSize();
  printer << ">";
}

LogicalResult MXTensorType::verify(function_ref<InFlightDiagnostic()> emitError,
                                   ArrayRef<int64_t> shape, Type elementType,
                                   unsigned axis, unsigned blockSize) {
  if (shape.empty())
    return emitError() << "an MX tensor needs at least one dimension";
  if (!isa<Float8E4M3FNType, Float8E5M2Type>(elementType))
    return emitError() << "expects MX element type f8E4M3FN or f8E5M2, got "
                       << elementType;
  if (axis >= shape.size())
    return emitError() << "scaled axis " << axis << " is out of range for a "
                       << shape.size() << "-d MX tensor";
  if (blockSize == 0)
    return emitError() << "block size must be positive";
  for (int64_t d : shape)
    if (!ShapedType::isDynamic(d) && d < 0)
      return emitError() << "dimension sizes must be non-negative";
  int64_t scaled = shape[axis];
  if (ShapedType::isDynamic(scaled))
    return emitError() << "the scaled dimension (axis " << axis
                       << ") of an MX tensor must be static";
  if (scaled % blockSize != 0)
    return emitError() << "the scaled dimension (axis " << axis << ") has size "
                       << scaled
                       << ", which is not a multiple of the block size "
                       << blockSize
                       << " (pad it, e.g. with moe.dispatch pad_to)";
  return success();
}

SmallVector<int64_t> MXTensorType::getScalesShape() const {
  SmallVector<int64_t> shape(getShape());
  shape[getAxis()] /= getBlockSize();
  return shape;
}

Type MXTensorType::getScaleType() const {
  return Float8E8M0FNUType::get(getContext());
}

RankedTensorType MXTensorType::getDataType() const {
  return RankedTensorType::get(getShape(), getElementType());
}

RankedTensorType MXTensorType::getScalesType() const {
  return RankedTensorType::get(getScalesShape(), getScaleType());
}

Type MXTensorType::withShape(ArrayRef<int64_t> shape) const {
  return MXTensorType::get(getContext(), shape, getElementType(), getAxis(),
                           getBlockSize());
}

//===----------------------------------------------------------------------===//
// FP8BlockTensorType
//===----------------------------------------------------------------------===//

/// Parses `<` dims `x` element-type `,` `block` `=` `[` N (`,` N)* `]`
/// [`,` `pow2`] `>`.
Type FP8BlockTensorType::parse(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  SmallVector<int64_t> shape, block;
  Type elementType;
  if (parser.parseLess() ||
      parser.parseDimensionList(shape, /*allowDynamic=*/true,
                                /*withTrailingX=*/true) ||
      parser.parseType(elementType) || parser.parseComma() ||
      parser.parseKeyword("block") || parser.parseEqual() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
        return parser.parseInteger(block.emplace_back());
      }))
    return {};
  bool pow2 = false;
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("pow2"))
      return {};
    pow2 = true;
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<FP8BlockTensorType>(loc, parser.getContext(), shape,
                                               elementType, block, pow2);
}

void FP8BlockTensorType::print(AsmPrinter &printer) const {
  printer << "<";
  printDims(printer, getShape());
  printer << getElementType() << ", block = [";
  llvm::interleaveComma(getBlock(), printer);
  printer << "]";
  if (getPow2())
    printer << ", pow2";
  printer << ">";
}

LogicalResult
FP8BlockTensorType::verify(function_ref<InFlightDiagnostic()> emitError,
                           ArrayRef<int64_t> shape, Type elementType,
                           ArrayRef<int64_t> block, bool) {
  if (shape.empty())
    return emitError() << "a blockwise FP8 tensor needs at least one dimension";
  if (!isa<Float8E4M3FNType, Float8E5M2Type>(elementType))
    return emitError() << "expects FP8 element type f8E4M3FN or f8E5M2, got "
                       << elementType;
  for (int64_t d : shape)
    if (!ShapedType::isDynamic(d) && d < 0)
      return emitError() << "dimension sizes must be non-negative";
  if (block.size() != shape.size())
    return emitError() << "expects one block size per dimension: "
                       << block.size() << " for a " << shape.size()
                       << "-d tensor";
  for (auto [i, b] : llvm::enumerate(block))
    if (b < 1 || b > (1 << 20))
      return emitError() << "block size " << b << " of dimension " << i
                         << " is not in [1, 1048576]";
  return success();
}

SmallVector<int64_t> FP8BlockTensorType::getScalesShape() const {
  SmallVector<int64_t> shape;
  for (auto [d, b] : llvm::zip(getShape(), getBlock()))
    shape.push_back(ShapedType::isDynamic(d) ? d : (d + b - 1) / b);
  return shape;
}

Type FP8BlockTensorType::getScaleType() const {
  return Float32Type::get(getContext());
}

RankedTensorType FP8BlockTensorType::getDataType() const {
  return RankedTensorType::get(getShape(), getElementType());
}

RankedTensorType FP8BlockTensorType::getScalesType() const {
  return RankedTensorType::get(getScalesShape(), getScaleType());
}

Type FP8BlockTensorType::withShape(ArrayRef<int64_t> shape) const {
  return FP8BlockTensorType::get(getContext(), shape, getElementType(),
                                 getBlock(), getPow2());
}
