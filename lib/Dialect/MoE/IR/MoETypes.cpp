//===- MoETypes.cpp - moe dialect types -----------------------------------===//

#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoETypes.cpp.inc"

void MoEDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "moe/Dialect/MoE/IR/MoETypes.cpp.inc"
      >();
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
  for (int64_t d : getShape()) {
    if (ShapedType::isDynamic(d))
      printer << "?";
    else
      printer << d;
    printer << "x";
  }
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
